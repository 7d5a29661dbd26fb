// The single-rank communicator (dist/communicator.hpp): what TP = 1 and DP = 1 compile to. Collectives are
// the identity; misuse is refused as it would be in a real group. The MPI communicator's own tests run under
// mpirun (tests/dist).
#include <catch2/catch.hpp>

#include <cstddef>
#include <vector>

#include "infer/dist/communicator.hpp"
#include "infer/dist/data_parallel.hpp"

using namespace infer;

TEST_CASE("SingleRank: a group of one, every collective the identity", "[dist]") {
  dist::SingleRank c;
  STATIC_REQUIRE(dist::Communicator<dist::SingleRank>);
  CHECK(c.rank() == 0);
  CHECK(c.size() == 1);
  std::vector<float> v = {1.5f, -2.0f, 3.25f};
  c.all_reduce_sum(v);
  CHECK(v == std::vector<float>{1.5f, -2.0f, 3.25f});
  std::vector<float> all(3, 0.0f);
  c.all_gather(v, all);
  CHECK(all == v);
  std::vector<std::byte> bytes = {std::byte{7}, std::byte{9}};
  c.broadcast(bytes, 0);
  CHECK(bytes[1] == std::byte{9});
  c.barrier();
  std::vector<float> wrong(4);
  CHECK_THROWS_AS(c.all_gather(v, wrong), InvalidArgument);
  CHECK_THROWS_WITH(c.broadcast(bytes, 1), Catch::Contains("root 1"));
}

TEST_CASE("split_evenly: contiguous chunks in rank order, the first n % ranks one longer, all covered once", "[dist]") {
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{200}, std::size_t{201}})
    for (const int ranks : {1, 2, 3, 8}) {
      INFO(n << " items over " << ranks << " ranks");
      std::size_t next = 0;
      for (int r = 0; r < ranks; ++r) {
        const dist::ItemRange got = dist::split_evenly(n, r, ranks);
        CHECK(got.begin == next);
        CHECK(got.size() == n / static_cast<std::size_t>(ranks) + (static_cast<std::size_t>(r) < n % static_cast<std::size_t>(ranks) ? 1 : 0));
        next = got.end;
      }
      CHECK(next == n);
    }
}
