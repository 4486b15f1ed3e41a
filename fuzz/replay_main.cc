// The replay driver: a main() for the fuzz targets in the normal (gcc) build. Runs every file
// named on the command line, and every file in every directory named there, through
// LLVMFuzzerTestOneInput once, so the seed corpus and the crash regressions run as plain tests
// without libFuzzer. A crash, sanitizer report or failed check ends the process, failing the
// test; finding no input at all fails it too (an empty corpus directory is a mistake).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

int RunFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
    return 1;
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::fprintf(stderr, "replay: %s (%zu bytes)\n", path.c_str(), bytes.size());
  // Copied into an exactly sized buffer so that reads past the end are caught by ASan.
  std::vector<uint8_t> data(bytes.begin(), bytes.end());
  LLVMFuzzerTestOneInput(data.empty() ? nullptr : data.data(), data.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    std::filesystem::path arg(argv[i]);
    std::error_code error;
    if (std::filesystem::is_directory(arg, error)) {
      for (const auto& entry : std::filesystem::recursive_directory_iterator(arg)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
    } else {
      files.push_back(arg);
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "replay: no inputs given (usage: %s FILE_OR_DIR...)\n", argv[0]);
    return 2;
  }
  int failures = 0;
  for (const auto& file : files) failures += RunFile(file);
  std::fprintf(stderr, "replay: %zu inputs, %d unreadable\n", files.size(), failures);
  return failures == 0 ? 0 : 1;
}
