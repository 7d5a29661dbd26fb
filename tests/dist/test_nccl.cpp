// dist::Nccl on the one GPU of the test machine: a group of one, so every collective is the identity, run through
// NCCL itself over device memory (joining non-blocking, enqueuing on the stream, waiting with the timeout's
// polling). The multi-GPU run is issue 22's. Built where CMake finds NCCL (infer::nccl), apart from test_cuda so
// that test_cuda runs where NCCL's library is absent.
#include <catch2/catch.hpp>

#if INFER_HAVE_NCCL

#include <cuda_runtime.h>

#include <cstddef>
#include <random>
#include <vector>

#include "infer/dist/nccl.hpp"
#include "support/cuda_test_support.hpp"

using namespace infer;

TEST_CASE("dist::Nccl: a group of one on this GPU, every collective through NCCL", "[cuda][dist]") {
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  {
    dist::SingleRank host;
    dist::Nccl nccl = dist::Nccl::join(host, 0, stream);  // the id "broadcast" over a group of one
    CHECK(nccl.rank() == 0);
    CHECK(nccl.size() == 1);
    std::mt19937 rng(test::test_seed("dist::Nccl"));
    std::normal_distribution<float> nd;
    std::vector<float> v(4099);
    for (auto& x : v) x = nd(rng);
    test::DeviceMem d(v.size() * 4), all(v.size() * 4);
    test::upload(d.p, v);
    nccl.all_reduce_sum(std::span<float>(d.as<float>(), v.size()));
    CHECK(test::download<float>(d.p, v.size()) == v);
    CUDA_REQUIRE(cudaMemset(all.p, 0xff, v.size() * 4));
    nccl.all_gather(std::span<const float>(d.as<float>(), v.size()), std::span<float>(all.as<float>(), v.size()));
    CHECK(test::download<float>(all.p, v.size()) == v);
    nccl.broadcast(std::span<std::byte>(d.as<std::byte>(), v.size() * 4), 0);
    CHECK(test::download<float>(d.p, v.size()) == v);
    nccl.barrier();
    // Enqueued only, then waited for by the stream: what a captured decode step does.
    nccl.all_reduce_sum_async(std::span<float>(d.as<float>(), v.size()));
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    CHECK(test::download<float>(d.p, v.size()) == v);
    CHECK_THROWS_AS(nccl.broadcast(std::span<std::byte>(d.as<std::byte>(), 4), 1), InvalidArgument);
    CHECK_THROWS_AS(nccl.all_gather(std::span<const float>(d.as<float>(), 4), std::span<float>(all.as<float>(), 8)),
                    InvalidArgument);
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

#endif
