//! Image attachments of prompts and steering (issue 15): checked, stored content-addressed in the home (`attachments/<sha256>`), referenced by hash in events and the transcript, and read back as base64 when a model request is built.

use crate::error::{Error, Result};
use crate::host::files::sha256_hex;
use crate::provider::ChatMessage;
use base64::Engine;
use std::path::{Path, PathBuf};

/// The media types a model service takes as native image blocks.
pub const MEDIA_TYPES: &[&str] = &["image/png", "image/jpeg", "image/gif", "image/webp"];
/// The most one attachment may hold, decoded. A request body is also bounded
/// by the server's body limit (4 MiB by default, 413 beyond), which base64
/// inflates by a third.
pub const MAX_BYTES: usize = 2 * 1024 * 1024;
/// The most attachments one input may carry.
pub const MAX_COUNT: usize = 4;
/// The longest name kept, in characters.
pub const MAX_NAME: usize = 255;

// The reference type lives with the events that carry it (event.rs), below
// the session, so the log's folds need nothing from this module.
pub use crate::event::AttachmentRef;

/// An attachment as a client sent it, checked and decoded.
pub struct Upload {
    pub media_type: String,
    pub name: String,
    pub bytes: Vec<u8>,
}

fn refused(reason: &'static str, message: String) -> Error {
    Error::invalid(message).with_reason(reason)
}

/// Checks and decodes one attachment (`i` is its index, for messages).
pub fn decode(i: usize, media_type: &str, data: &str, name: &str) -> Result<Upload> {
    if !MEDIA_TYPES.contains(&media_type) {
        return Err(refused(
            "unsupported_media_type",
            format!(
                "attachments[{i}]: media_type {:?} is not supported; use one of {}",
                media_type.chars().take(64).collect::<String>(),
                MEDIA_TYPES.join(", ")
            ),
        ));
    }
    // Checked before decoding, so an oversized upload costs no decode.
    if data.len() / 4 * 3 > MAX_BYTES + 2 {
        return Err(too_large(i));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| {
            refused(
                "bad_base64",
                format!("attachments[{i}]: data is not valid base64: {e}"),
            )
        })?;
    if bytes.len() > MAX_BYTES {
        return Err(too_large(i));
    }
    if bytes.is_empty() {
        return Err(refused("bad_base64", format!("attachments[{i}]: data is empty")));
    }
    if name.chars().count() > MAX_NAME || name.chars().any(char::is_control) {
        return Err(Error::invalid(format!(
            "attachments[{i}]: name must be at most {MAX_NAME} characters without control characters"
        )));
    }
    Ok(Upload {
        media_type: media_type.to_string(),
        name: name.to_string(),
        bytes,
    })
}

fn too_large(i: usize) -> Error {
    refused(
        "attachment_too_large",
        format!("attachments[{i}]: more than {MAX_BYTES} bytes decoded; send a smaller image"),
    )
}

/// Refuses more than `MAX_COUNT` attachments.
pub fn check_count(n: usize) -> Result<()> {
    if n > MAX_COUNT {
        return Err(refused(
            "too_many_attachments",
            format!("{n} attachments; at most {MAX_COUNT} per input"),
        ));
    }
    Ok(())
}

/// Checks an input's attachments (media_type, base64 data, name) and
/// stores them: their references, in order.
pub async fn accept(home: &Path, list: Vec<(String, String, String)>) -> Result<Vec<AttachmentRef>> {
    check_count(list.len())?;
    let uploads = list
        .iter()
        .enumerate()
        .map(|(i, (media_type, data, name))| decode(i, media_type, data, name))
        .collect::<Result<Vec<Upload>>>()?;
    store(home, uploads).await
}

fn dir(home: &Path) -> PathBuf {
    home.join("attachments")
}

fn path_of(home: &Path, sha256: &str) -> Result<PathBuf> {
    // Ours, but read back from ledgers: never a path out of the folder.
    if sha256.len() != 64
        || !sha256
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        return Err(Error::internal(format!("not an attachment hash: {sha256:?}")));
    }
    Ok(dir(home).join(sha256))
}

/// Stores the uploads content-addressed (a file already there is kept: same
/// hash, same bytes), each written whole to a temporary file (0600) then
/// renamed, on a blocking thread. Returns their references in order.
pub async fn store(home: &Path, uploads: Vec<Upload>) -> Result<Vec<AttachmentRef>> {
    if uploads.is_empty() {
        return Ok(Vec::new());
    }
    let home = home.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let dir = dir(&home);
        crate::home::create_private_dir(&dir)
            .map_err(|e| Error::internal(format!("cannot create {}: {e}", dir.display())))?;
        uploads
            .into_iter()
            .map(|u| {
                let sha256 = sha256_hex(&u.bytes);
                let path = path_of(&home, &sha256)?;
                if !path.exists() {
                    // Another input storing the same bytes at once may win
                    // the temporary file: its file is this one.
                    if let Err(e) = crate::home::write_private_file(&dir, &sha256, &u.bytes) {
                        if !path.exists() {
                            return Err(e);
                        }
                    }
                }
                Ok(AttachmentRef {
                    sha256,
                    media_type: u.media_type,
                    name: u.name,
                    size: u.bytes.len() as u64,
                })
            })
            .collect()
    })
    .await
    .map_err(|e| Error::internal(format!("attachment store task: {e}")))?
}

/// Fills in the bytes (base64) of every image of `messages` from the home,
/// on a blocking thread. A file that is gone fails the request: the model
/// would otherwise answer about an image it never saw.
pub async fn load(home: &Path, messages: &mut [ChatMessage]) -> Result<()> {
    let wanted: Vec<String> = messages
        .iter()
        .flat_map(|m| match m {
            ChatMessage::User { images, .. } => images.iter().map(|i| i.sha256.clone()).collect(),
            _ => Vec::new(),
        })
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let home = home.to_path_buf();
    let mut loaded = tokio::task::spawn_blocking(move || {
        wanted
            .into_iter()
            .map(|sha| {
                let path = path_of(&home, &sha)?;
                let bytes = std::fs::read(&path).map_err(|e| {
                    Error::internal(format!("cannot read attachment {}: {e}", path.display()))
                })?;
                Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
            })
            .collect::<Result<Vec<String>>>()
    })
    .await
    .map_err(|e| Error::internal(format!("attachment load task: {e}")))??
    .into_iter();
    for m in messages.iter_mut() {
        if let ChatMessage::User { images, .. } = m {
            for image in images.iter_mut() {
                image.data = loaded.next().unwrap_or_default();
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn each_refusal_has_its_reason() {
        let reason = |r: Result<Upload>| r.err().and_then(|e| e.reason);
        assert_eq!(
            reason(decode(0, "text/plain", &b64(b"x"), "")),
            Some("unsupported_media_type")
        );
        assert_eq!(
            reason(decode(0, "image/png", "!!not base64", "")),
            Some("bad_base64")
        );
        assert_eq!(reason(decode(0, "image/png", "", "")), Some("bad_base64"));
        let big = b64(&vec![0u8; MAX_BYTES + 1]);
        assert_eq!(
            reason(decode(1, "image/png", &big, "")),
            Some("attachment_too_large")
        );
        let ok = decode(0, "image/webp", &b64(&vec![7u8; MAX_BYTES]), "a.webp").unwrap();
        assert_eq!(ok.bytes.len(), MAX_BYTES);
        assert!(decode(0, "image/png", &b64(b"x"), "a\nb").is_err());
        assert_eq!(
            check_count(MAX_COUNT + 1).err().and_then(|e| e.reason),
            Some("too_many_attachments")
        );
        assert!(check_count(MAX_COUNT).is_ok());
    }

    #[tokio::test]
    async fn stored_files_are_owner_only_content_addressed_and_load_back() {
        use std::os::unix::fs::PermissionsExt;
        let home = tempfile::tempdir().unwrap();
        let up = |bytes: &[u8]| Upload {
            media_type: "image/png".into(),
            name: "s.png".into(),
            bytes: bytes.to_vec(),
        };
        let refs = store(home.path(), vec![up(b"png bytes"), up(b"png bytes")])
            .await
            .unwrap();
        assert_eq!(refs[0], refs[1], "the same bytes are one file");
        assert_eq!(refs[0].sha256, sha256_hex(b"png bytes"));
        let path = home.path().join("attachments").join(&refs[0].sha256);
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let names: Vec<_> = std::fs::read_dir(home.path().join("attachments"))
            .unwrap()
            .collect();
        assert_eq!(names.len(), 1, "no temporary file is left behind");
        let mut messages = vec![ChatMessage::User {
            text: "look".into(),
            images: crate::event::images(&refs),
        }];
        load(home.path(), &mut messages).await.unwrap();
        let ChatMessage::User { images, .. } = &messages[0] else {
            unreachable!()
        };
        assert_eq!(images[1].data, b64(b"png bytes"));
    }
}
