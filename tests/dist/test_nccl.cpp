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

#include "infer/core/half.hpp"
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
    // As the decoder's DeviceGroup: on another stream, bf16 too, captured into a graph.
    dist::DeviceGroup& g = nccl;
    CHECK(g.capturable());
    cudaStream_t other;
    CUDA_REQUIRE(cudaStreamCreate(&other));
    std::vector<std::uint16_t> h(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
    test::DeviceMem hb(h.size() * 2);
    test::upload(hb.p, h);
    g.all_reduce_sum_bf16(hb.as<std::uint16_t>(), h.size(), other);
    g.all_reduce_sum(d.as<float>(), v.size(), other);
    CUDA_REQUIRE(cudaMemset(all.p, 0xff, v.size() * 4));
    cudaGraph_t graph;
    CUDA_REQUIRE(cudaStreamBeginCapture(other, cudaStreamCaptureModeThreadLocal));
    g.all_gather(d.as<float>(), all.as<float>(), v.size(), other);
    CUDA_REQUIRE(cudaStreamEndCapture(other, &graph));
    cudaGraphExec_t exec;
    CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_REQUIRE(cudaGraphLaunch(exec, other));
    CUDA_REQUIRE(cudaStreamSynchronize(other));
    CHECK(test::download<std::uint16_t>(hb.p, h.size()) == h);
    CHECK(test::download<float>(all.p, v.size()) == v);
    CUDA_REQUIRE(cudaGraphExecDestroy(exec));
    CUDA_REQUIRE(cudaGraphDestroy(graph));
    CUDA_REQUIRE(cudaStreamDestroy(other));
    CHECK_THROWS_AS(nccl.broadcast(std::span<std::byte>(d.as<std::byte>(), 4), 1), InvalidArgument);
    CHECK_THROWS_AS(nccl.all_gather(std::span<const float>(d.as<float>(), 4), std::span<float>(all.as<float>(), 8)),
                    InvalidArgument);
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

#endif
