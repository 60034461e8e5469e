#include "core/process_exit.h"

#include <atomic>

namespace qinfer {

namespace {
std::atomic<bool> g_without_teardown{false};
}

void request_exit_without_teardown() { g_without_teardown = true; }

bool exit_without_teardown_requested() { return g_without_teardown; }

}  // namespace qinfer
