// --backend's choice (executor/backend_choice.hpp) with the CUDA backend module missing, refused
// by the loader, and present (the emulated module, one emulated GPU).
#include "executor/backend_choice.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace np::exec {
namespace {

void use_module(const std::string& path) { setenv("NANOPLAN_CUDA_MODULE", path.c_str(), 1); }

TEST(BackendChoice, CpuAndBadNames) {
  Result<Executor> cpu = choose_executor("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_FALSE(cpu->device);
  EXPECT_EQ(cpu->cuda, nullptr);
  EXPECT_TRUE(cpu->fallback.empty());
  EXPECT_NE(cpu->backend(), nullptr);
  EXPECT_EQ(choose_executor("gpu").error().message,
            "invalid --backend 'gpu' (valid: cpu, cuda, auto)");
}

TEST(BackendChoice, NoModule) {
  use_module("/nonexistent/libnanoplan_cuda.so");
  Result<Executor> cuda = choose_executor("cuda");
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.error().message,
            "--backend cuda: the CUDA backend module /nonexistent/libnanoplan_cuda.so is not "
            "built (a build with the CUDA toolkit makes it) (valid here: cpu, auto)");
  Result<Executor> fallback = choose_executor("auto");
  ASSERT_TRUE(fallback.ok());
  EXPECT_FALSE(fallback->device);
  EXPECT_NE(fallback->fallback.find("is not built"), std::string::npos) << fallback->fallback;
}

TEST(BackendChoice, AModuleTheLoaderRefuses) {
  std::string path = (std::filesystem::temp_directory_path() / "np_broken_module.so").string();
  std::ofstream(path) << "not an ELF file\n";
  use_module(path);
  Result<Executor> cuda = choose_executor("cuda");
  std::filesystem::remove(path);
  ASSERT_FALSE(cuda.ok());
  EXPECT_TRUE(cuda.error().message.starts_with("--backend cuda: cannot load the CUDA backend: "))
      << cuda.error().message;
  EXPECT_EQ(cuda.error().message.find('\n'), std::string::npos);
}

TEST(BackendChoice, TheEmulatedModuleRunsTheCudaBackend) {
  use_module(NP_CUDA_EMU_MODULE);
  for (const char* name : {"cuda", "auto"}) {
    Result<Executor> ex = choose_executor(name);
    ASSERT_TRUE(ex.ok()) << ex.error().message;
    EXPECT_TRUE(ex->device) << name;
    ASSERT_NE(ex->cuda, nullptr);
    EXPECT_EQ(ex->cuda->abi, cuda::kModuleAbi);
    EXPECT_TRUE(ex->fallback.empty());
    EXPECT_NE(ex->backend(), nullptr);
    EXPECT_NE(ex->transfer, nullptr);
  }
}

}  // namespace
}  // namespace np::exec
