// Experiment: can a hot page-cache read into host memory beat pread?
// Compares, with N threads over a 4 GiB file in the page cache:
//   memcpy / NT-store copy (ceilings), pread, mmap(chunk)+NT copy, mmap(chunk)+memcpy,
//   and the same into small reused (staging-like) buffers.
// Results: docs/benchmarks.md ("Hot reads into host memory").
//   g++ -O3 -mavx2 -std=c++17 -pthread scripts/probe/hostread_probe.cpp -o /tmp/probe && /tmp/probe /tmp/probe.bin [MiB]
#include <immintrin.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static void nt_copy(char* dst, const char* src, size_t n) {
  // head: bring dst to 32-byte alignment
  size_t head = (32 - (reinterpret_cast<uintptr_t>(dst) & 31)) & 31;
  if (head > n) head = n;
  std::memcpy(dst, src, head);
  dst += head; src += head; n -= head;
  size_t blocks = n / 128;
  for (size_t i = 0; i < blocks; ++i) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 64));
    __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 96), d);
    src += 128; dst += 128;
  }
  n -= blocks * 128;
  std::memcpy(dst, src, n);
  _mm_sfence();
}

static size_t FILE_SIZE = size_t(4) << 30;
static size_t CHUNK = size_t(16) << 20;

// Runs fn(chunk_index) over all chunks with nthreads workers; returns GB/s.
static double run(int nthreads, size_t total, size_t chunk, const std::function<void(size_t, size_t)>& fn) {
  std::atomic<size_t> next{0};
  size_t nchunks = (total + chunk - 1) / chunk;
  double t0 = now();
  std::vector<std::thread> ts;
  for (int t = 0; t < nthreads; ++t)
    ts.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < nchunks;) {
        size_t off = i * chunk, len = std::min(chunk, total - off);
        fn(off, len);
      }
    });
  for (auto& t : ts) t.join();
  return total / (now() - t0) / 1e9;
}

static void report(const char* name, int threads, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::printf("%-34s thr=%2d  median %6.2f  min %6.2f  max %6.2f GB/s\n", name, threads, v[v.size() / 2], v.front(), v.back());
  std::fflush(stdout);
}

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "/tmp/probe.bin";
  int runs = 5;
  if (argc > 2) FILE_SIZE = size_t(std::atoll(argv[2])) << 20;
  int fd = open(path, O_RDWR | O_CREAT, 0644);
  struct stat st; fstat(fd, &st);
  if (size_t(st.st_size) != FILE_SIZE) {
    std::vector<char> buf(CHUNK);
    for (size_t off = 0; off < FILE_SIZE; off += CHUNK) {
      for (size_t i = 0; i < CHUNK; i += 8) *reinterpret_cast<uint64_t*>(&buf[i]) = off + i;
      pwrite(fd, buf.data(), CHUNK, off);
    }
  }
  char* dst = static_cast<char*>(mmap(nullptr, FILE_SIZE + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  madvise(dst, FILE_SIZE + 4096, MADV_HUGEPAGE);
  std::memset(dst, 1, FILE_SIZE + 4096);
  char* src = static_cast<char*>(mmap(nullptr, FILE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  madvise(src, FILE_SIZE, MADV_HUGEPAGE);
  std::memset(src, 2, FILE_SIZE);
  // warm the page cache
  run(16, FILE_SIZE, CHUNK, [&](size_t off, size_t len) { pread(fd, dst + off, len, off); });
  long page = sysconf(_SC_PAGESIZE);

  for (int threads : {8, 16, 32}) {
    std::vector<double> a, b, c, d, e, f, g;
    for (int r = 0; r < runs; ++r) {
      a.push_back(run(threads, FILE_SIZE, CHUNK, [&](size_t off, size_t len) { std::memcpy(dst + off, src + off, len); }));
      b.push_back(run(threads, FILE_SIZE, CHUNK, [&](size_t off, size_t len) { nt_copy(dst + off, src + off, len); }));
      c.push_back(run(threads, FILE_SIZE, CHUNK, [&](size_t off, size_t len) { pread(fd, dst + off, len, off); }));
      d.push_back(run(threads, FILE_SIZE, CHUNK, [&](size_t off, size_t len) {
        void* m = mmap(nullptr, len, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, off);
        nt_copy(dst + off, static_cast<char*>(m), len);
        munmap(m, len);
      }));
      e.push_back(run(threads, FILE_SIZE, CHUNK, [&](size_t off, size_t len) {
        void* m = mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, off);
        nt_copy(dst + off, static_cast<char*>(m), len);
        munmap(m, len);
      }));
      f.push_back(run(threads, FILE_SIZE, CHUNK, [&](size_t off, size_t len) {
        void* m = mmap(nullptr, len, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, off);
        std::memcpy(dst + off, static_cast<char*>(m), len);
        munmap(m, len);
      }));
      // unaligned destination (+1): what a user buffer at an odd offset sees
      g.push_back(run(threads, FILE_SIZE, CHUNK, [&](size_t off, size_t len) {
        void* m = mmap(nullptr, len, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, off);
        nt_copy(dst + 1 + off, static_cast<char*>(m), len);
        munmap(m, len);
      }));
    }
    report("memcpy anon->anon", threads, a);
    report("nt copy anon->anon", threads, b);
    report("pread", threads, c);
    report("mmap populate + nt copy", threads, d);
    report("mmap lazy + nt copy", threads, e);
    report("mmap populate + memcpy", threads, f);
    report("mmap populate + nt copy dst+1", threads, g);
  }
  // whole-file map once, then threads copy
  for (int threads : {16}) {
    std::vector<double> h;
    for (int r = 0; r < runs; ++r) {
      double t0 = now();
      char* m = static_cast<char*>(mmap(nullptr, FILE_SIZE, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0));
      double t1 = now();
      run(threads, FILE_SIZE, CHUNK, [&](size_t off, size_t len) { nt_copy(dst + off, m + off, len); });
      munmap(m, FILE_SIZE);
      h.push_back(FILE_SIZE / (now() - t0) / 1e9);
      if (r == 0) std::printf("whole map populate took %.1f ms\n", (t1 - t0) * 1e3);
    }
    report("whole mmap populate + nt copy", threads, h);
  }
  // bounce-buffer style: per-thread 4 MiB buffer reused (the GPU path's host half)
  for (int threads : {16}) {
    std::vector<double> p, q;
    size_t bb = 4 << 20;
    std::vector<char*> bufs(64);
    for (auto& x : bufs) { x = static_cast<char*>(aligned_alloc(4096, bb)); std::memset(x, 0, bb); }
    std::atomic<int> slot{0};
    thread_local int my = -1;
    for (int r = 0; r < runs; ++r) {
      p.push_back(run(threads, FILE_SIZE, bb, [&](size_t off, size_t len) {
        if (my < 0) my = slot.fetch_add(1) % 64;
        pread(fd, bufs[my], len, off);
      }));
      q.push_back(run(threads, FILE_SIZE, CHUNK, [&](size_t off, size_t len) {
        if (my < 0) my = slot.fetch_add(1) % 64;
        char* m = static_cast<char*>(mmap(nullptr, len, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, off));
        for (size_t o = 0; o < len; o += bb) nt_copy(bufs[my], m + o, std::min(bb, len - o));
        munmap(m, len);
      }));
    }
    report("pread into 4MiB bounce", threads, p);
    report("mmap+nt into 4MiB bounce", threads, q);
  }
  std::printf("page %ld\n", page);
  return 0;
}
