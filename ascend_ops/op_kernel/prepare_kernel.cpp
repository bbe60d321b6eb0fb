// Window preparation: makes this die's window ready for a layer's calls and meets every
// die of the group, before a Buffer's first call and again whenever the window last held another
// layer's layout. HCCL's window outlives Buffers and starts with whatever HCCL or an earlier layer
// left in it, so a layer cannot trust it unprepared. The meeting goes through the windows, not an
// HCCL collective, which may stage data in the very window (docs/ASCEND.md).
//
// 0. reset this AIV's call counter (the next call is number 1 on every die: the fill leaves no flag
//    of any number, and HCCL's window starts with whatever was there).
// 1. arrive: the token (nonce, epoch) into every die's arrival entry for this die, then wait for
//    every die's token here. A die arrives only after its earlier calls ended, so no write of theirs
//    lands here after the fill: a call that completed on this die saw every write addressed to it,
//    and after a timeout the late writer arrives only once its own call ended.
// 2. fill: both slots of this layer's window: zeros (zeroed flags, records and count messages match
//    no epoch) and, in sp, the sentinel in the marker bytes of every block of every row area. The
//    header, where the tokens and the call counters live, is left alone.
// 3. ready: once every AIV's share is filled (a fence, SyncAll), the token into every die's ready
//    entry for this die; wait for every die's. A die's next call starts after this op ended, so no
//    die writes into a peer's slots before the peer filled them.
//
// Input: token [2] int64 (the group's nonce, this preparation's number on the group); output:
// scratch (status words and counters).
#include "op_tiling.h"
#include "prepare.h"

// The UbepPrepare op's kernel (op_host/mc2/ubep_prepare_def.cpp): its input, its output (`scratch`,
// zeroed by the caller), the framework's workspace (unused) and the tiling. The windows come from
// the op's HCCL group. A MIX kernel type: its hard SyncAll needs the inter-core scheduling an
// AIV_ONLY kernel does not get (A2/A3, SyncAll doc).
extern "C" __global__ __aicore__ void ubep_prepare(GM_ADDR token, GM_ADDR scratch, GM_ADDR, GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIV_1_0);
  REGISTER_TILING_DEFAULT(ubep_ascend::EpOpTiling);
  GET_TILING_DATA_WITH_STRUCT(ubep_ascend::EpOpTiling, op_tiling, tiling);
  AscendC::TPipe pipe;
  ubep_ascend::PrepareKernel op;
  op.Init(token, scratch, &op_tiling.ep, &pipe);
  op.Process();
}
