// The executor's side of the CUDA module (module.hpp): find the file, dlopen it, check its table.
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>

#include "executor/cuda/module.hpp"

namespace np::cuda {

std::string module_path() {
  if (const char* env = std::getenv("NANOPLAN_CUDA_MODULE"); env && *env) return env;
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "libnanoplan_cuda.so";
  std::filesystem::path dir = exe.parent_path();
  std::filesystem::path beside = dir / "libnanoplan_cuda.so";
#if defined(NANOPLAN_INSTALL_LIBDIR)
  const char* libdir = NANOPLAN_INSTALL_LIBDIR;  // cmake --install's, beside <prefix>/bin
#else
  const char* libdir = "lib";
#endif
  std::filesystem::path installed = dir.parent_path() / libdir / "nanoplan" / "libnanoplan_cuda.so";
  if (!std::filesystem::exists(beside, ec) && std::filesystem::exists(installed, ec))
    return installed.string();
  return beside.string();
}

Result<const Module*> load_module() {
  // Opened once per path for the process's life (the handle is never closed); a failure is
  // remembered too, so a run says it once.
  static std::mutex mu;
  static std::map<std::string, Result<const Module*>> opened;
  std::string path = module_path();
  std::lock_guard lock(mu);
  if (auto it = opened.find(path); it != opened.end()) return it->second;
  auto open = [&]() -> Result<const Module*> {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec))
      return make_error("the CUDA backend module " + path +
                        " is not built (a build with the CUDA toolkit makes it)");
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* why = dlerror();
      return make_error("cannot load the CUDA backend: " + std::string(why ? why : path));
    }
    using Entry = const Module* (*)();
    auto entry = reinterpret_cast<Entry>(dlsym(h, "nanoplan_cuda_module"));
    const Module* m = entry ? entry() : nullptr;
    if (!m || m->abi != kModuleAbi || m->size != sizeof(Module))
      return make_error(path + " is not this build's CUDA backend module (rebuild it: "
                               "tools/build --target nanoplan_cuda)");
    return m;
  };
  return opened.emplace(path, open()).first->second;
}

}  // namespace np::cuda
