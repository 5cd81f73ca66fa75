// Items (layers, experts) shared out over threads: each thread, the calling one included, takes
// the next unclaimed index until none is left or one has failed.
#ifndef QMOE_TOOLS_QMOE_PARALLEL_ITEMS_H_
#define QMOE_TOOLS_QMOE_PARALLEL_ITEMS_H_

#include <cstdint>
#include <functional>
#include <string>

// Calls work(item, thread, &why) for the items [begin, end) on `threads` threads (at least 1;
// thread 0 is the caller's), and on_done(items finished so far) on the calling thread after
// each of its own items (may be empty). A work that returns false stops every thread from
// claiming more; the first failure's `why` is returned, "" when all succeeded.
std::string run_items_in_parallel(
    uint32_t begin, uint32_t end, unsigned threads,
    const std::function<bool(uint32_t item, unsigned thread, std::string* why)>& work,
    const std::function<void(uint32_t finished)>& on_done);

#endif  // QMOE_TOOLS_QMOE_PARALLEL_ITEMS_H_
