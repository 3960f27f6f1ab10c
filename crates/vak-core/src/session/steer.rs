//! Steering read against the chain's goal: an input that arrives while a chain is live is classified (`goal.rs`) and published as a `goal_update`; pause, resume and cancel act on the run instead of becoming its next leg.

use crate::event::ClientEvent;
use crate::goal::{self, GoalUpdate, Relation};
use crate::session::admission::{AdmissionState, RunState};
use crate::session::live::Session;

impl Session {
    /// Reads `text`, admitted into a live chain, as a goal update and
    /// publishes it; a pause, resume or cancel is carried out on `run` (a
    /// cancel through the run's own cancel) and answered `Applied`, since
    /// it is not the model's input. None: the input goes on as a leg.
    /// A message asking for wider permissions is recorded with that flag
    /// and changes nothing: the mode changes only through its own API.
    pub(crate) fn steer_goal(
        &self,
        run: &mut RunState,
        text: &str,
        request_id: &str,
    ) -> Option<AdmissionState> {
        if !run.running() {
            return None;
        }
        let (relation, signals, widens) = goal::classify(text);
        self.publish(ClientEvent::GoalUpdate {
            update: Box::new(GoalUpdate {
                relation,
                text: text.to_string(),
                signals,
                request_id: request_id.to_string(),
                widens_permissions: widens,
                at_seq: 0,
            }),
        });
        match relation {
            Relation::Cancel => {
                run.cancel();
            }
            Relation::Pause => run.pause(),
            Relation::Resume => run.resume(),
            _ => return None,
        }
        Some(AdmissionState::Applied)
    }
}
