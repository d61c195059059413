// omp_neighbour.cc: the "omp" load of bench/contention.py, a program like the neighbours a
// serving host runs beside gdn: an OpenMP loop of tiny parallel regions, each ending at the
// barrier that waits for every thread it started. Two of these on a 2-core host made
// `gdn bench --op step --preset decode-1 --threads 2` about 90x slower than --threads 1
// (issue 34), while plain busy loops did not: it is threads that wait for threads.
//
// It runs until SIGTERM or SIGINT (or --seconds), or until its parent exits (so that a killed
// benchmark leaves no orphan), then prints how many regions it ran. Not part of the library.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#if defined(__linux__)
#include <sys/prctl.h>
#endif

namespace {

constexpr const char* kHelp = R"(usage: gdn_omp_neighbour [--threads N] [--work N] [--seconds S]

A load for bench/contention.py: an OpenMP loop of tiny parallel regions (each: one pass over
--work floats split among --threads threads, then the region's closing barrier), until
SIGTERM, SIGINT, --seconds, or the parent process's exit. Prints "ready" once the first region
has run, and on exit the regions run and their rate.

options:
  --threads N   threads per parallel region (default 2)
  --work N      floats per region, 1 to 16777216 (default 4096: a few microseconds)
  --seconds S   stop after S seconds, 0 = only when stopped (default 0)
  --help        show this help

examples:
  gdn_omp_neighbour                       # 2 threads, until stopped
  gdn_omp_neighbour --seconds 10 --work 65536
)";

volatile std::sig_atomic_t g_stop = 0;

void on_signal(int) { g_stop = 1; }

long parse(const char* name, const char* value, long min, long max) {
  char* end = nullptr;
  const long x = value != nullptr ? std::strtol(value, &end, 10) : 0;
  if (value == nullptr || *value == '\0' || *end != '\0' || x < min || x > max) {
    std::fprintf(stderr,
                 "gdn_omp_neighbour: option '%s': expected an integer in [%ld, %ld], given '%s'\n",
                 name, min, max, value != nullptr ? value : "");
    std::exit(2);
  }
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  long threads = 2, work = 4096, seconds = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (arg == "--help" || arg == "-h") {
      std::fputs(kHelp, stdout);
      return 0;
    } else if (arg == "--threads") {
      threads = parse("--threads", value, 1, 1024), ++i;
    } else if (arg == "--work") {
      work = parse("--work", value, 1, 1L << 24), ++i;
    } else if (arg == "--seconds") {
      seconds = parse("--seconds", value, 0, 86400), ++i;
    } else {
      std::fprintf(stderr, "gdn_omp_neighbour: unknown option '%s' (see --help)\n", arg.c_str());
      return 2;
    }
  }
  const pid_t parent = getppid();
#if defined(__linux__)
  // The parent's death stops this process too (checked again in the loop: the parent may have
  // died before this call).
  prctl(PR_SET_PDEATHSIG, SIGTERM);
#endif
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);

  std::vector<float> data(static_cast<std::size_t>(work), 1.0f);
  float* const x = data.data();
  const int n = static_cast<int>(threads);
  const auto start = std::chrono::steady_clock::now();
  long long regions = 0;
  while (g_stop == 0) {
#pragma omp parallel for num_threads(n) schedule(static)
    for (long i = 0; i < work; ++i) x[i] = x[i] * 0.999f + 0.001f;
    if (++regions == 1) {
      std::printf("ready\n");
      std::fflush(stdout);
    }
    // A system call costs well under a region's microseconds; every 16th region is enough.
    if ((regions & 15) == 0 && getppid() != parent) break;
    if (seconds > 0 && std::chrono::steady_clock::now() - start >= std::chrono::seconds(seconds)) {
      break;
    }
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // x[0] is printed so that the loop has an observable result.
  std::printf("regions %lld seconds %.3f per_second %.0f threads %ld work %ld x0 %.3f\n", regions,
              elapsed, static_cast<double>(regions) / elapsed, threads, work,
              static_cast<double>(x[0]));
  return 0;
}
