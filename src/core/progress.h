// A progress bar on stderr for long work (loading, long prefill, benchmark sweeps). Silent when stderr is
// not a terminal, so logs and CI output stay clean.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace qinfer {

class Progress {
public:
    Progress(std::string label, int64_t total);
    ~Progress();
    void update(int64_t done, const std::string & note = "");
    void finish();
    // Bars made on this thread stay silent (tensor parallel: ranks after the first load beside rank 0's bar).
    static void quiet_on_this_thread(bool quiet);

private:
    std::string label_;
    int64_t total_;
    bool enabled_;
    bool finished_ = false;
    std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace qinfer
