// The MPI communicator (dist/mpi.hpp) on 2 or more ranks (ctest runs it under `mpirun -np 2`): each collective
// against what it must give, computed on every rank from the ranks' known inputs; and a collective that one
// rank never joins ends in the timeout on the others, not in a hang.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

#include "infer/dist/mpi.hpp"

using namespace infer;

namespace {
/// Rank r's i-th value: distinct per rank and index, exact in f32 sums.
float value_of(int r, std::size_t i) { return static_cast<float>(r * 1000 + static_cast<int>(i)) * 0.5f; }
}  // namespace

TEST_CASE("Mpi: all_reduce_sum, all_gather, broadcast, barrier and gather_bytes give the answers they must", "[dist][mpi]") {
  dist::Mpi c;
  REQUIRE(c.size() >= 2);
  const int n = c.size();
  for (const std::size_t len : {std::size_t{1}, std::size_t{4096}, std::size_t{100003}}) {
    INFO("rank " << c.rank() << ", " << len << " values");
    std::vector<float> v(len);
    for (std::size_t i = 0; i < len; ++i) v[i] = value_of(c.rank(), i);
    c.all_reduce_sum(v);
    int bad = 0;
    for (std::size_t i = 0; i < len; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += value_of(r, i);
      bad += v[i] == want ? 0 : 1;
    }
    CHECK(bad == 0);

    std::vector<float> mine(len), all(len * static_cast<std::size_t>(n), -1.0f);
    for (std::size_t i = 0; i < len; ++i) mine[i] = value_of(c.rank(), i);
    c.all_gather(mine, all);
    bad = 0;
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < len; ++i) bad += all[static_cast<std::size_t>(r) * len + i] == value_of(r, i) ? 0 : 1;
    CHECK(bad == 0);
  }
  std::vector<std::byte> bytes(1000);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>((i * 7 + static_cast<std::size_t>(c.rank())) & 0xff);
  c.broadcast(bytes, n - 1);  // the last rank's bytes everywhere
  int bad = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i)
    bad += bytes[i] == static_cast<std::byte>((i * 7 + static_cast<std::size_t>(n - 1)) & 0xff) ? 0 : 1;
  CHECK(bad == 0);
  c.barrier();
  // gather_bytes: rank r sends r + 1 bytes of value r; the root gets them in rank order.
  const std::vector<std::byte> mine(static_cast<std::size_t>(c.rank() + 1), static_cast<std::byte>(c.rank()));
  const auto got = c.gather_bytes(mine, 0);
  if (c.rank() == 0) {
    REQUIRE(got.size() == static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r)
      CHECK(got[static_cast<std::size_t>(r)] ==
            std::vector<std::byte>(static_cast<std::size_t>(r + 1), static_cast<std::byte>(r)));
  } else {
    CHECK(got.empty());
  }
  std::vector<float> wrong(3);
  CHECK_THROWS_AS(c.all_gather(std::vector<float>(2), wrong), InvalidArgument);  // refused before any rank sends
  CHECK_THROWS_WITH(c.broadcast(bytes, n), Catch::Contains("root"));
}

TEST_CASE("Mpi: a collective that a rank never joins times out on the others, naming what waited", "[dist][mpi]") {
  std::string reported;
  dist::Mpi late(MPI_COMM_WORLD, std::chrono::milliseconds(300), [&](const std::string& m) { reported = m; });
  dist::Mpi sync;  // the ranks meet again here, on a communicator of their own
  std::vector<float> v(16, 1.0f);
  if (late.rank() == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(late.all_reduce_sum(v), DistributedError);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(waited >= 0.3);
    CHECK(waited < 5.0);
    CHECK_THAT(reported, Catch::Contains("rank 0 of") && Catch::Contains("all_reduce_sum of 16") &&
                             Catch::Contains("did not complete within 0.3 s"));
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(800));  // joins after rank 0 gave up
    late.all_reduce_sum(v);  // completes against rank 0's pending request
  }
  sync.barrier();
}
