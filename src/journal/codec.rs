//! The one place records meet bincode: every stored value is an envelope of a record kind,
//! a schema version and the bincode payload, so a later codec or schema change stays local.
//! (bincode 2 is unmaintained, RUSTSEC-2025-0141; a switch would only touch this file.)

use serde::Serialize;
use serde::de::DeserializeOwned;
use thiserror::Error;

/// The kinds of record the journal stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordKind {
    /// A pod's current record.
    Pod = 1,
    /// One transition in a pod's log.
    Transition = 2,
    /// The journal's own metadata.
    Meta = 3,
    /// The server slots of one configuration's backends.
    Slots = 4,
    /// The auxiliary files a validation replaced on one pod, and what they replaced.
    Uploads = 5,
    /// The server slots of one backend of one configuration.
    BackendSlots = 6,
}

/// Errors decoding a stored value.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CodecError {
    /// Too short to hold an envelope.
    #[error("a stored value of {len} bytes is too short for an envelope")]
    Truncated {
        /// Its length.
        len: usize,
    },
    /// The envelope names another kind of record.
    #[error("expected a {expected:?} record, found kind {found}")]
    WrongKind {
        /// What was expected.
        expected: RecordKind,
        /// The kind byte found.
        found: u8,
    },
    /// The payload does not decode as the version it claims.
    #[error("{kind:?} record version {version}: {detail}")]
    Payload {
        /// The record kind.
        kind: RecordKind,
        /// The version it claims.
        version: u16,
        /// bincode's message.
        detail: String,
    },
    /// Encoding failed (only with values serde cannot represent).
    #[error("encoding a {kind:?} record: {detail}")]
    Encode {
        /// The record kind.
        kind: RecordKind,
        /// bincode's message.
        detail: String,
    },
}

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Encodes a record of `kind` at schema `version`.
pub fn encode<T: Serialize>(kind: RecordKind, version: u16, record: &T) -> Result<Vec<u8>, CodecError> {
    let payload = bincode::serde::encode_to_vec(record, config())
        .map_err(|e| CodecError::Encode { kind, detail: e.to_string() })?;
    let mut bytes = Vec::with_capacity(payload.len() + 3);
    bytes.push(kind as u8);
    bytes.extend_from_slice(&version.to_le_bytes());
    bytes.extend_from_slice(&payload);
    Ok(bytes)
}

/// Reads an envelope: the version, and the payload to decode with [`decode_payload`].
pub fn open(kind: RecordKind, bytes: &[u8]) -> Result<(u16, &[u8]), CodecError> {
    if bytes.len() < 3 {
        return Err(CodecError::Truncated { len: bytes.len() });
    }
    if bytes[0] != kind as u8 {
        return Err(CodecError::WrongKind { expected: kind, found: bytes[0] });
    }
    Ok((u16::from_le_bytes([bytes[1], bytes[2]]), &bytes[3..]))
}

/// Decodes a payload as the record type of `version`; trailing bytes are an error.
pub fn decode_payload<T: DeserializeOwned>(kind: RecordKind, version: u16, payload: &[u8]) -> Result<T, CodecError> {
    let (record, used) = bincode::serde::decode_from_slice(payload, config()).map_err(|e| CodecError::Payload {
        kind,
        version,
        detail: e.to_string(),
    })?;
    if used != payload.len() {
        return Err(CodecError::Payload { kind, version, detail: format!("{} trailing bytes", payload.len() - used) });
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_what_is_not_its_record() {
        let bytes = encode(RecordKind::Meta, 1, &("haptic", 7u32)).unwrap();
        let (version, payload) = open(RecordKind::Meta, &bytes).unwrap();
        assert_eq!(version, 1);
        assert_eq!(decode_payload::<(String, u32)>(RecordKind::Meta, version, payload).unwrap(), ("haptic".into(), 7));
        assert_eq!(
            open(RecordKind::Pod, &bytes).unwrap_err(),
            CodecError::WrongKind { expected: RecordKind::Pod, found: 3 }
        );
        assert_eq!(open(RecordKind::Meta, &[3]).unwrap_err(), CodecError::Truncated { len: 1 });
        assert!(decode_payload::<(String, u32)>(RecordKind::Meta, 1, &payload[..2]).is_err());
    }
}
