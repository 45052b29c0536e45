//! External tags: a per-block tag buffer beside the data, for the layer above.
//!
//! dm-integrity without `internal_hash` stores whatever tags the layer above hands it (the
//! kernel's bio integrity payload): dm-crypt in AEAD mode (`aes-gcm-random`,
//! `aes-xts-plain64` + `hmac(sha256)`) puts its IV and authentication tag there, one tag per
//! encryption sector. [`TaggedDevice`] is that interface for sealdisk layers:
//!
//! ```text
//!   CryptTarget (AEAD)          write_tagged(off, ciphertext, tags) / read_tagged(off, buf, tags)
//!        │   data[block 0] data[block 1] ...  +  tags[tag 0][tag 1] ...   (tag_size each)
//!   IntegrityTarget (no internal hash)
//!        │   data → data area, tags → tag area (or the journal entry in mode J)
//!   device below
//! ```
//!
//! Contract:
//! * `tags.len()` = `buf.len() / tag_block_size() × tag_size()`, else `InvalidArgument`.
//! * A tagged write stores data and tags together, with the same durability and ordering as
//!   `write_at` (in mode J both go through one journal entry, so after a crash a block and its
//!   tag are either both old or both new).
//! * `read_tagged` returns the stored tags unchecked when the device has no internal hash
//!   (checking them is the upper layer's job); with an internal hash the data were checked
//!   and the tags are the internal ones.
//! * Plain `write_at` on a device with external tags stores zero tags; plain `read_at`
//!   returns the data without any check.
use blockdev::{BlockDevice, BlockResult, WriteFlags};

/// A block device that keeps a `tag_size()`-byte tag beside every `tag_block_size()` bytes of
/// data (see the module docs).
pub trait TaggedDevice: BlockDevice {
    /// Bytes of tag per tagged block.
    fn tag_size(&self) -> usize;

    /// Bytes of data one tag covers (the integrity block size).
    fn tag_block_size(&self) -> usize;

    /// Reads data and their tags.
    fn read_tagged(&self, off: u64, buf: &mut [u8], tags: &mut [u8]) -> BlockResult<()>;

    /// Writes data together with their tags.
    fn write_tagged(&self, off: u64, buf: &[u8], tags: &[u8], flags: WriteFlags) -> BlockResult<()>;
}
