// Large fresh outputs on transparent huge pages.
//
// A fresh buffer is faulted in page by page as a kernel first writes it: with 4 KiB pages
// that is one fault per 4 KiB (allocating and writing 64 MB took 28-41 ms against 9-15 ms
// advised, one thread; docs/notes). madvise(MADV_HUGEPAGE) on the whole pages inside a buffer
// of kHugeMin bytes or more (numpy's threshold for its own arrays) asks the kernel for 2 MiB
// pages; it changes no value, and where none is free the kernel uses small pages as before.
// Advised only where the kernel's transparent huge pages are in "madvise" mode (in "always"
// mode large buffers get them anyway), and not with NORMLAB_HUGEPAGES=0.
#pragma once

#include <cstdint>

namespace normlab {

constexpr int64_t kHugeMin = int64_t(1) << 22;

// Advise [data, data + bytes) onto huge pages when it is kHugeMin bytes or more and the rule
// above allows it (a no-op elsewhere, and on systems without madvise). Every family's output
// allocation calls this one function.
void advise_huge_pages(void* data, int64_t bytes);

}  // namespace normlab
