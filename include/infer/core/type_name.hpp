#pragma once
/// \file
/// `type_name<T>()`: a type's name as a user wrote it ("ContinuousBatchScheduler<MyPolicy>"), for error
/// messages that name a policy. `typeid(T).name()` is mangled under GCC and Clang; the C++ ABI's demangler
/// turns it back, and where there is none the mangled name is still unique.

#include <cstdlib>
#include <memory>
#include <string>
#include <typeinfo>

#if __has_include(<cxxabi.h>)
#include <cxxabi.h>
#define INFER_HAVE_CXXABI 1
#endif

namespace infer {

template <class T>
[[nodiscard]] std::string type_name() {
  const char* mangled = typeid(T).name();
#if defined(INFER_HAVE_CXXABI)
  int status = 0;
  const std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(mangled, nullptr, nullptr, &status),
                                                          std::free);
  if (status == 0 && demangled) return demangled.get();
#endif
  return mangled;
}

}  // namespace infer
