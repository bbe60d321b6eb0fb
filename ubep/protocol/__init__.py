"""Data-as-Flag wire formats: how a receiver learns that a batch of rows has arrived.

Four modes (``docs/PROTOCOL.md`` is the full specification, with efficiency tables):

- ``sw``  stop-and-wait: payload blocks, release fence, then a 16-byte record ``(epoch, N)``.
- ``tff`` token-flag fusion: every block leads with a flag holding the call's u64 epoch; flags are
  never reset because a later call always writes a different epoch.
- ``dc``  data checksum: payload only (marker words xored with an epoch mask), then one record
  ``(epoch, checksum)`` per (source, destination) batch, checked against what the receiver holds.
- ``sp``  sentinel polling: the receiver pre-fills block markers with a signaling-NaN sentinel and polls
  for change; a batch with a row that would look like the sentinel also gets a fenced ``(epoch, N)``
  record (the ``sw`` fallback), so no row can wait forever.

Call ``e`` (u64, from 1) uses receive slot ``e & 1``; a slot only ever holds data of calls ``e - 2,
e - 4, ...``, which no predicate accepts for call ``e``. All integers are little-endian; the checksum is
u32 arithmetic only, so the Triton, Ascend C and C++ twins reproduce it bit for bit from
``tests/vectors/protocol.json``.
"""

from ubep.protocol.codec import arrived_blocks, arrived_rows, decode, empty_receive, encode, tff_flag
from ubep.protocol.dc import checksum, epoch_digest, mask_words
from ubep.protocol.efficiency import efficiency_table, payload_efficiency
from ubep.protocol.sentinel import choose_sentinel, sentinel_candidates, sentinel_presence
from ubep.protocol.sp import row_collides, sentinel_bytes, sentinel_fill
from ubep.protocol.vectors import build_vectors, write_vectors
from ubep.protocol.wire_format import MODES, WireFormat, check_epoch, slot
from ubep.protocol.words import RECORD_BYTES, fmix32, make_record, read_record

__all__ = [
    "MODES", "RECORD_BYTES", "WireFormat", "arrived_blocks", "arrived_rows", "build_vectors", "check_epoch",
    "checksum", "choose_sentinel", "decode", "efficiency_table", "empty_receive", "encode", "epoch_digest",
    "fmix32", "make_record", "mask_words", "payload_efficiency", "read_record", "row_collides",
    "sentinel_bytes", "sentinel_candidates", "sentinel_fill", "sentinel_presence", "slot", "tff_flag",
    "write_vectors",
]
