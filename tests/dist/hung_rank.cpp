// A job whose rank 1 hangs (sleeps past any timeout) while rank 0 waits in an all-reduce: rank 0's timeout must
// end the whole job with a message (ctest: dist_mpi_hung_rank, run with INFER_DIST_TIMEOUT_S=2, checks the
// message and that the job ends well before its own 60 s limit).
#include <chrono>
#include <thread>
#include <vector>

#include "infer/dist/mpi.hpp"

int main(int argc, char** argv) {
  infer::dist::MpiSession mpi(argc, argv);
  infer::dist::Mpi c;
  std::vector<float> v(4096, 1.0f);
  if (c.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(600));
  c.all_reduce_sum(v);  // rank 0: times out and aborts the job
  return 0;
}
