// What the CPU's and the GPUs' tensor-parallel tests share: five requests of different prompt lengths through the
// scheduler (chunked prompts beside decoding rows), each asking for six tokens.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "runtime/engine.h"
#include "runtime/scheduler.h"

namespace qinfer::test {

// The tokens of the five requests in the order the scheduler streamed them (30 in all); the pool is left empty.
inline std::vector<int> scheduled_tokens(Engine & e) {
    SchedulerOptions so;
    so.pool.max_rows = 3;
    so.pool.max_step_tokens = 16;
    so.pool.max_seq_tokens = 96;
    so.pool.n_blocks = 24;
    Scheduler s(e, so);
    std::vector<int> tokens;
    for (int i = 0; i < 5; i++) {
        RequestOptions r;
        for (int t = 0; t < 7 + 9 * i; t++) r.prompt.push_back((t * 13 + i * 5 + 1) % 256);
        r.max_new_tokens = 6;
        r.ignore_eos = true;
        s.submit(r, {[&tokens](const TokenEvent & ev) {
                         tokens.push_back(ev.token);
                         return true;
                     },
                     nullptr});
    }
    s.run_until_idle();
    EXPECT_EQ(s.stats().blocks_used, 0);
    return tokens;
}

}  // namespace qinfer::test
