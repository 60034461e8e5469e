// The process's way out when part of it cannot be torn down: tensor parallel's NCCL abort, still running on a thread
// of its own after the engine stopped waiting for it (a peer process that died can keep ncclCommAbort blocked), must
// not have CUDA and NCCL torn down under it by static destructors: the process then crashed at exit after printing
// its error (rc 139; 2026-11-30, the multi-process kill test). main() ends such a process with std::_Exit instead.
#pragma once

namespace qinfer {

void request_exit_without_teardown();
bool exit_without_teardown_requested();

}  // namespace qinfer
