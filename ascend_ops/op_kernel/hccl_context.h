// The HCCL context of an MC2 op, as the kernel reads it: AscendC::GetHcclContext<0>() is the GM
// address of an HcclOpResParam that the runtime fills for the op's communication group (the op's
// "group" attribute, op_host/mc2/). ubep reads its own rank's window (localWindowsIn) and, per
// peer r, remoteRes[r].nextDevicePtr -> HcclRankRelationResV2 -> windowsIn (hccl_windows.h).
//
// GUESS (unverified on hardware): CANN does not document these structs. The names and the order of
// the fields below are those of the HCCL headers that MC2 kernels such as MoeDistributeDispatch
// build against. The kernels read the head (up to rWinStart, the same in every copy of those headers)
// and find remoteRes at byte rWinStart, as the toolkit's Hccl accessor does; the byte sizes of the
// blocks between (localRes .. remoteResNum) are those of one CANN 8.x version, which puts remoteRes at
// byte 2984 (another puts it at 3320): only the twin's default layout depends on them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ubep_ascend::hccl {

constexpr uint32_t kMaxRanks = 128 * 1024;  // length of remoteRes
constexpr size_t kRemoteResOffset = 2984;  // in this struct; the kernels use rWinStart

struct Mc2Workspace {
  uint64_t workSpace;
  uint64_t workSpaceSize;
};

// One entry per rank of the group, indexed by the rank's id in the group.
struct RemoteResPtr {
  uint64_t nextHostPtr;
  uint64_t nextDevicePtr;  // GM address of that rank's HcclRankRelationResV2
};

// What this rank sees of a peer: GM addresses of the peer's windows, mapped for this rank.
struct HcclRankRelationResV2 {
  uint32_t remoteUsrRankId;
  uint32_t remoteWorldRank;
  uint64_t windowsIn;   // the data window: HCCL_BUFFSIZE MB; ubep's whole window lives here
  uint64_t windowsOut;
  uint64_t windowsExp;  // the small "expansion" window; ubep does not use it
  uint64_t nextTagRes[4];
};

struct HcclOpResParam {
  Mc2Workspace mc2WorkSpace;
  uint32_t localUsrRankId;  // this rank's id in the group
  uint32_t rankSize;        // ranks in the group
  uint64_t winSize;         // bytes of each windowsIn
  uint64_t localWindowsIn;
  uint64_t localWindowsOut;
  char hcomId[128];         // the group's name
  uint64_t winExpSize;
  uint64_t localWindowsExp;
  uint32_t rWinStart;       // byte offset of remoteRes from the start of this struct
  uint32_t rWinOffset;
  uint64_t version;
  uint8_t localRes[2472];   // streams and notifies of the AICPU side
  uint8_t topoInfo[160];
  uint8_t config[48];
  uint64_t hostStateInfo;
  uint64_t aicpuStateInfo;
  uint64_t lockAddr;
  uint32_t rsv[16];
  uint32_t notifysize;
  uint32_t remoteResNum;
  RemoteResPtr remoteRes[kMaxRanks];
};

static_assert(offsetof(HcclOpResParam, localWindowsIn) == 32, "HCCL context: head layout");
static_assert(offsetof(HcclOpResParam, localWindowsExp) == 184, "HCCL context: head layout");
static_assert(offsetof(HcclOpResParam, rWinStart) == 192, "HCCL context: head layout");
static_assert(offsetof(HcclOpResParam, remoteRes) == kRemoteResOffset, "HCCL context: remoteRes offset");
static_assert(offsetof(HcclRankRelationResV2, windowsIn) == 8, "HCCL peer record: windowsIn offset");

}  // namespace ubep_ascend::hccl
