# xxHash (header-only use: XXH_INLINE_ALL) as the imported target infer::xxhash, for the prefix cache's
# block hashes. Debian's libxxhash-dev has no CMake package; installed with infer so consumers find it too.
if(NOT TARGET infer::xxhash)
  find_path(INFER_XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
  add_library(infer::xxhash INTERFACE IMPORTED)
  target_include_directories(infer::xxhash INTERFACE ${INFER_XXHASH_INCLUDE_DIR})
endif()
