#include "core/progress.h"

#include <unistd.h>

#include <cstdio>

namespace qinfer {

namespace {
thread_local bool thread_quiet = false;
}

void Progress::quiet_on_this_thread(bool quiet) { thread_quiet = quiet; }

Progress::Progress(std::string label, int64_t total)
    : label_(std::move(label)), total_(total > 0 ? total : 1), enabled_(isatty(2) != 0 && !thread_quiet),
      start_(std::chrono::steady_clock::now()), last_(start_ - std::chrono::seconds(1)) {}

Progress::~Progress() { finish(); }

void Progress::update(int64_t done, const std::string & note) {
    if (!enabled_ || finished_) return;
    auto now = std::chrono::steady_clock::now();
    if (done < total_ && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const int width = 30;
    int filled = int(width * done / total_);
    std::string bar(size_t(filled), '#');
    bar.resize(size_t(width), '.');
    double secs = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "\r%s [%s] %3d%% %.1fs %s\033[K", label_.c_str(), bar.c_str(), int(100 * done / total_), secs,
                 note.c_str());
    std::fflush(stderr);
}

void Progress::finish() {
    if (!enabled_ || finished_) return;
    finished_ = true;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
}

}  // namespace qinfer
