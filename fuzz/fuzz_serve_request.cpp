// libFuzzer target: `qinfer serve`'s request bodies (tools/serve_api.h) as completions and as chat completions, the
// JSON of a response to an accepted request (invalid UTF-8 in the text included), and the stop-string matcher fed the
// input in pieces. Any body must parse or throw api::ApiError with a 4xx status.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tools/serve_api.h"

using namespace qinfer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string body(reinterpret_cast<const char *>(data), size);
    api::Limits limits;
    limits.vocab = 151936;
    for (const bool chat : {false, true}) {
        try {
            const api::Request r = api::parse_request(body, chat, SamplingParams{}, limits);
            const std::vector<api::TokenLogprob> lps = {{body.substr(0, 8), -0.5f, {{body.substr(0, 4), -1.0f}}}};
            (void)api::completion_json(r, "id", 0, {{body.substr(0, 64), "stop", lps}}, {1, 1});
            (void)api::chunk_json(r, "id", 0, 0, body.substr(0, 64), "", true, &lps);
            (void)api::usage_chunk_json(r, "id", 0, {1, 2});
            api::StopMatcher m(r.stop);
            std::string out;
            for (size_t at = 0; at < body.size(); at += 7) out += m.push(body.substr(at, 7));
            out += m.flush();
            if (out.size() > body.size()) std::abort();
        } catch (const api::ApiError & e) {
            if (e.status < 400 || e.status > 499) std::abort();
        }
    }
    return 0;
}
