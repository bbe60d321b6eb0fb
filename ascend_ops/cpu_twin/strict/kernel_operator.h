// The strict CPU twin of the Ascend C API subset the ubep kernels use, for A2/A3 (NPU arch 2201).
// Kernels include it as "kernel_operator.h" (this directory on the include path); with CANN they
// include the toolkit's. It fails where the chip would:
// - real signatures, types and dtype limits (twin/types.h, tensor.h, data_copy.h, vector.h);
//   LocalTensor::GetPhyAddr() is a UB offset, as on the chip;
// - four asynchronous pipes per AIV (S, V, MTE2, MTE3) with a happens-before race checker:
//   operations run at once, in program order, but two conflicting accesses of one AIV that no
//   SetFlag/WaitFlag, PipeBarrier, TQue event or SyncAll orders abort the process (clocks.h,
//   shadow.h, core.h); UBEP_TWIN_AUTO_SYNC=1 emulates --cce-auto-sync=on;
// - a per-AIV write-back scalar data cache with no coherence (dcache.h);
// - SyncAll's kernel-type and workspace rules (syncall.h);
// - GM windows of other dies as 512-byte transactions (windows.h).
// Every abort prints "ascend twin (strict), die D, AIV B of N: ..." on stderr.
#pragma once

#include "twin/types.h"
#include "twin/report.h"
#include "twin/windows.h"
#include "twin/clocks.h"
#include "twin/shadow.h"
#include "twin/dcache.h"
#include "twin/core.h"
#include "twin/tensor.h"
#include "twin/sync.h"
#include "twin/tpipe.h"
#include "twin/queue.h"
#include "twin/data_copy.h"
#include "twin/data_copy_pad.h"
#include "twin/convert.h"
#include "twin/vector.h"
#include "twin/vector_index.h"
#include "twin/syncall.h"
#include "twin/launch.h"
