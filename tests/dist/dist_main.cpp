// Catch2's runner for the tests that run under mpirun: MPI starts before the tests and ends after them, and
// every rank runs the same tests (a collective in a test meets the same collective on the other ranks).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "infer/dist/mpi.hpp"

int main(int argc, char** argv) {
  infer::dist::MpiSession mpi(argc, argv);
  return Catch::Session().run(argc, argv);
}
