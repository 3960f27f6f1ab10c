//! ListReceipts: a session's model-call and tool-call receipts from its ledger.

use super::AgentApi;
use tonic::Status;
use vak_proto::v1 as pb;

impl AgentApi {
    pub(super) async fn receipts(
        &self,
        _r: pb::ListReceiptsRequest,
    ) -> Result<pb::ListReceiptsResponse, Status> {
        Err(Status::unimplemented("receipts are not built yet"))
    }
}
