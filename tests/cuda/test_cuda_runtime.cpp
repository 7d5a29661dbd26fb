// The CUDA runtime layer (backend/cuda_runtime.hpp): device buffers round-trip bytes and report out of
// memory with the bytes asked and free; the weight arena aligns to 256 bytes and names its capacity
// when full; kv_pool_bytes follows vLLM's gpu_memory_utilization arithmetic.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "infer/backend/cuda_runtime.hpp"
#include "support/test_seed.hpp"
#include "infer/core/error.hpp"

using namespace infer;
namespace rt = infer::backend::cuda;

TEST_CASE("check() turns a CUDA error into a DeviceError naming the error and the operation", "[cuda][ops][runtime]") {
  CHECK_NOTHROW(rt::check(cudaSuccess, "nothing"));
  try {
    rt::check(cudaErrorInvalidValue, "copying the widgets");
    FAIL("check did not throw");
  } catch (const DeviceError& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("copying the widgets") != std::string::npos);
    CHECK(m.find("cudaErrorInvalidValue") != std::string::npos);
    CHECK(e.code() == Errc::device);
  }
}

TEST_CASE("DeviceBuffer round-trips bytes, fills, moves and checks sizes", "[cuda][ops][runtime]") {
  const auto seed = test::test_seed("DeviceBuffer round trip");
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const std::size_t n = 1000 + rng() % 5000;
  std::vector<std::uint32_t> host(n);
  for (auto& x : host) x = static_cast<std::uint32_t>(rng());

  rt::DeviceBuffer buf(n * 4);
  REQUIRE(buf.size() == n * 4);
  REQUIRE(buf.data() != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(buf.data()) % 256 == 0);
  buf.upload(std::span<const std::uint32_t>(host));
  std::vector<std::uint32_t> back(n, 0);
  buf.download(std::span<std::uint32_t>(back));
  CHECK(back == host);

  // Partial transfers at an offset.
  const std::vector<std::uint32_t> patch{1u, 2u, 3u};
  buf.upload(std::span<const std::uint32_t>(patch), 8);
  std::vector<std::uint32_t> got3(3);
  buf.download(std::span<std::uint32_t>(got3), 8);
  CHECK(got3 == patch);

  // Moving transfers ownership and leaves the source empty.
  rt::DeviceBuffer moved = std::move(buf);
  CHECK(buf.size() == 0);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  CHECK(buf.data() == nullptr);
  CHECK(moved.size() == n * 4);
  moved.fill_bytes(0xab);
  moved.download(std::span<std::uint32_t>(back));
  for (std::size_t i = 0; i < n; ++i)
    if (back[i] != 0xababababu) FAIL("word " << i << " is " << back[i] << " after fill_bytes(0xab)");

  rt::DeviceBuffer other(16);
  other = std::move(moved);
  CHECK(other.size() == n * 4);

  // Transfers that do not fit are the caller's error, not CUDA's.
  std::vector<std::uint32_t> too_big(n + 1);
  CHECK_THROWS_AS(other.upload(std::span<const std::uint32_t>(too_big)), InvalidArgument);
  CHECK_THROWS_AS(other.download(std::span<std::uint32_t>(too_big)), InvalidArgument);
  CHECK_THROWS_AS(other.download(std::span<std::uint32_t>(got3), n * 4 - 4), InvalidArgument);

  rt::DeviceBuffer empty(0);
  CHECK(empty.data() == nullptr);
  CHECK_NOTHROW(empty.fill_bytes(0));
}

TEST_CASE("DeviceBuffer out of memory says how many bytes were asked and how many are free", "[cuda][ops][runtime]") {
  const std::size_t pib = std::size_t{1} << 50;
  try {
    rt::DeviceBuffer huge(pib);
    FAIL("a 1 PiB cudaMalloc succeeded");
  } catch (const DeviceError& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find(std::to_string(pib)) != std::string::npos);
    CHECK(m.find("out of memory") != std::string::npos);
    CHECK(m.find("bytes free of") != std::string::npos);
  }
  CHECK(cudaGetLastError() == cudaSuccess);  // the failed allocation leaves no error behind
  rt::DeviceBuffer small(64);                // and the device still works
  CHECK(small.data() != nullptr);
}

TEST_CASE("DeviceArena bump-allocates 256-byte aligned blocks and names its capacity when full",
          "[cuda][ops][runtime]") {
  rt::DeviceArena arena(4096);
  REQUIRE(arena.capacity() == 4096);
  auto* base = static_cast<std::byte*>(arena.base());
  auto* p1 = static_cast<std::byte*>(arena.allocate(1));
  auto* p2 = static_cast<std::byte*>(arena.allocate(300));
  float* p3 = arena.allocate<float>(10);
  CHECK(p1 == base);
  CHECK(p2 - base == 256);
  CHECK(reinterpret_cast<std::byte*>(p3) - base == 768);
  for (const void* p : {static_cast<const void*>(p1), static_cast<const void*>(p2), static_cast<const void*>(p3)})
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
  CHECK(arena.used() == 768 + 40);
  auto* p4 = static_cast<std::byte*>(arena.allocate(3000));  // 1024 + 3000 = 4024 <= 4096
  CHECK(p4 - base == 1024);
  const std::size_t used = arena.used();
  try {
    (void)arena.allocate(100);  // would start at 4096
    FAIL("the arena over-allocated");
  } catch (const DeviceError& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("capacity of 4096 bytes") != std::string::npos);
    CHECK(m.find("100 bytes") != std::string::npos);
  }
  CHECK(arena.used() == used);  // a failed allocation changes nothing
  CHECK_THROWS_AS(arena.allocate(std::numeric_limits<std::size_t>::max()), DeviceError);
  CHECK_THROWS_AS(arena.allocate<double>(std::numeric_limits<std::size_t>::max() / 4), DeviceError);

  // The memory is real: write through one allocation and read it back.
  const std::vector<float> vals{1.5f, -2.0f, 3.25f};
  REQUIRE(cudaMemcpy(p3, vals.data(), 12, cudaMemcpyHostToDevice) == cudaSuccess);
  std::vector<float> back(3);
  REQUIRE(cudaMemcpy(back.data(), p3, 12, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(back == vals);

  arena.reset();
  CHECK(arena.used() == 0);
  CHECK(arena.allocate(4096) == arena.base());
  CHECK(rt::DeviceArena::align_up(0) == 0);
  CHECK(rt::DeviceArena::align_up(257) == 512);
}

TEST_CASE("memory_info and kv_pool_bytes follow gpu_memory_utilization's meaning", "[cuda][ops][runtime]") {
  const rt::MemoryInfo mem = rt::memory_info();
  CHECK(mem.total > 0);
  CHECK(mem.free > 0);
  CHECK(mem.free <= mem.total);

  const std::size_t gib = std::size_t{1} << 30;
  CHECK(rt::kv_pool_bytes(0.5, 10 * gib, 100 * gib) == 40 * gib);
  CHECK(rt::kv_pool_bytes(1.0, 0, 100 * gib) == 100 * gib);
  CHECK(rt::kv_pool_bytes(0.25, 25 * gib, 100 * gib) == 0);
  const std::size_t p90 = rt::kv_pool_bytes(0.9, 10 * gib, 100 * gib);  // 0.9 is not exact in binary
  CHECK(p90 >= 80 * gib - 1);
  CHECK(p90 <= 80 * gib);
  for (double bad : {0.0, -0.1, 1.0000001, 1.5, std::nan("")}) {
    INFO("utilization " << bad);
    CHECK_THROWS_AS(rt::kv_pool_bytes(bad, 0, 100 * gib), InvalidArgument);
  }
  try {
    (void)rt::kv_pool_bytes(0.1, 20 * gib, 100 * gib);
    FAIL("a budget below the bytes in use was accepted");
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("raise gpu_memory_utilization") != std::string::npos);
  }
  const std::size_t half = rt::kv_pool_bytes(0.5, 0);  // the device overload reads the real total
  CHECK(half <= mem.total / 2 + 1);
  CHECK(half + 1 >= mem.total / 2);
}

TEST_CASE("Stream and EventTimer time work on a stream", "[cuda][ops][runtime]") {
  rt::Stream stream;
  REQUIRE(stream.get() != nullptr);
  rt::DeviceBuffer buf(std::size_t{64} << 20);
  rt::EventTimer timer;
  timer.start(stream.handle());
  for (int i = 0; i < 4; ++i) rt::check(cudaMemsetAsync(buf.data(), i, buf.size(), stream.get()), "cudaMemsetAsync");
  timer.stop(stream.handle());
  const float ms = timer.elapsed_ms();
  CHECK(ms > 0.0f);
  CHECK(ms < 10000.0f);
  stream.synchronize();
  rt::Stream moved = std::move(stream);
  CHECK(moved.get() != nullptr);
  CHECK(stream.get() == nullptr);  // NOLINT(bugprone-use-after-move)
  std::vector<unsigned char> first(16);
  buf.download(std::span<unsigned char>(first));
  for (unsigned char b : first) CHECK(b == 3);
}
