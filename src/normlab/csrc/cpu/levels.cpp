// The choice of the kernels' level at load: cpu/levels.h.
#include "cpu/levels.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#define NORMLAB_X86 1
#endif

extern "C" void* normlab_level_slots[];  // levels_table.cpp (generated)

namespace normlab::levels {
namespace {

#if defined(NORMLAB_X86)
struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};
Regs cpuid(unsigned leaf, unsigned sub = 0) {
  Regs r;
  if (!__get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d)) r = Regs{};
  return r;
}
uint64_t xcr0() {  // the register state the operating system saves (only with OSXSAVE)
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

// The features a level needs that this CPU lacks (GCC's -march=x86-64-v3 / -v4: each level
// includes the ones below it), named as /proc/cpuinfo names them.
std::vector<std::string> missing_for(const std::string& level) {
  std::vector<std::string> miss;
  if (level == "v1") return miss;
  const unsigned max = cpuid(0).a, max_ext = cpuid(0x80000000u).a;
  const Regs l1 = cpuid(1), l7 = max >= 7 ? cpuid(7, 0) : Regs{};
  const Regs e1 = max_ext >= 0x80000001u ? cpuid(0x80000001u) : Regs{};
  auto need = [&](bool have, const char* name) { if (!have) miss.push_back(name); };
  auto bit = [](unsigned r, int i) { return ((r >> i) & 1u) != 0; };
  const bool osxsave = bit(l1.c, 27);
  const uint64_t xcr = osxsave ? xcr0() : 0;
  // x86-64-v2
  need(bit(l1.c, 0), "pni");
  need(bit(l1.c, 9), "ssse3");
  need(bit(l1.c, 13), "cx16");
  need(bit(l1.c, 19), "sse4_1");
  need(bit(l1.c, 20), "sse4_2");
  need(bit(l1.c, 23), "popcnt");
  need(bit(e1.c, 0), "lahf_lm");
  // x86-64-v3
  need(bit(l1.c, 28), "avx");
  need(bit(l7.b, 5), "avx2");
  need(bit(l7.b, 3), "bmi1");
  need(bit(l7.b, 8), "bmi2");
  need(bit(l1.c, 29), "f16c");
  need(bit(l1.c, 12), "fma");
  need(bit(e1.c, 5), "abm");
  need(bit(l1.c, 22), "movbe");
  need(osxsave, "osxsave");
  need((xcr & 0x6) == 0x6, "xmm/ymm state (XCR0)");
  if (level == "v3") return miss;
  need(bit(l7.b, 16), "avx512f");
  need(bit(l7.b, 17), "avx512dq");
  need(bit(l7.b, 28), "avx512cd");
  need(bit(l7.b, 30), "avx512bw");
  need(bit(l7.b, 31), "avx512vl");
  need((xcr & 0xE0) == 0xE0, "opmask/zmm state (XCR0)");
  return miss;
}
#endif

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

Choice make_choice() {
  Choice ch;
  for (int i = 0; i < kNumBuilt; ++i) ch.built.push_back(kBuilt[i].name);
  ch.level = ch.built.front();
  const char* env = std::getenv("NORMLAB_CPU_LEVEL");
  const std::string forced = env != nullptr ? env : "";
  if (kSlots == 0) {  // one copy (NORMLAB_NATIVE=1, or not x86-64): nothing to choose
    ch.reason = "the only copy in this library (built with " + ch.level + " flags)";
    if (!forced.empty() && forced != ch.level)
      ch.error = "NORMLAB_CPU_LEVEL=" + forced + ": this library holds one copy of the kernels (" + ch.level +
                 "), built for the machine that built it; unset NORMLAB_CPU_LEVEL, or install the dispatched "
                 "build (pip install --no-build-isolation --force-reinstall --no-deps ., without NORMLAB_NATIVE)";
    return ch;
  }
#if defined(NORMLAB_X86)
  std::string best;
  for (const auto& lv : ch.built)
    if (missing_for(lv).empty()) {
      ch.cpu_runs.push_back(lv);
      best = lv;
    }
  if (forced.empty()) {
    ch.level = best;
    ch.reason = best == "v1" ? "the best level this CPU runs: it lacks " + join(missing_for("v3"), ", ") +
                                   " (needed for v3)"
                             : "the best level this CPU runs (cpuid/xgetbv)";
    return ch;
  }
  bool known = false;
  for (const auto& lv : ch.built) known = known || lv == forced;
  if (!known) {
    ch.error = "NORMLAB_CPU_LEVEL=" + forced + ": expected one of " + join(ch.built, ", ") +
               " (x86-64 levels in this library); unset it to take the best this CPU runs (" + best + ")";
    return ch;
  }
  const auto miss = missing_for(forced);
  if (!miss.empty()) {
    ch.error = "NORMLAB_CPU_LEVEL=" + forced + ": this CPU lacks " + join(miss, ", ") + ", which x86-64-" + forced +
               " needs; choose a level it runs (" + join(ch.cpu_runs, ", ") + ") or unset NORMLAB_CPU_LEVEL";
    return ch;
  }
  ch.level = forced;
  ch.reason = "forced by NORMLAB_CPU_LEVEL=" + forced + " (the best this CPU runs: " + best + ")";
#endif
  return ch;
}

const Choice& chosen() {
  static const Choice ch = [] {
    Choice c = make_choice();
    if (c.error.empty())
      for (int i = 0; i < kNumBuilt; ++i)
        if (c.level == kBuilt[i].name && kBuilt[i].table != nullptr)
          std::memcpy(normlab_level_slots, kBuilt[i].table, sizeof(void*) * size_t(kSlots));
    return c;
  }();
  return ch;
}

// Bound when the library loads, before any kernel can be called.
const bool bound_at_load = (chosen(), true);

}  // namespace

const Choice& choice() { return chosen(); }

int vec_bytes() {
  const std::string& lv = chosen().level;
  if (lv == "v4") return 64;
  if (lv == "v3") return 32;
  if (lv == "v1") return 16;
#if defined(__AVX512F__)
  return 64;  // one copy built with these flags
#elif defined(__AVX2__)
  return 32;
#else
  return 16;
#endif
}

}  // namespace normlab::levels
