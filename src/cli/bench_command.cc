// `loom bench WORKLOAD ...`: runs the agentic-workflow benchmark harness
// (bench/harness/loom_bench.py, Python) with every argument passed through,
// plus --loom-binary naming this executable so the harness can launch
// `loom serve` itself, one server per compared configuration.
//
// The harness is found from, in order: $LOOM_SOURCE_DIR, the folders above this
// executable (build dirs live in or below the source tree), and the source path
// this file was compiled from. The interpreter: $LOOM_PYTHON, else the source
// tree's .venv/bin/python (scripts/setup.sh makes it), else python3 on PATH.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "util/error.h"

namespace loom::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kHarnessScript = "bench/harness/loom_bench.py";

bool has_harness(const fs::path& root) {
  std::error_code error;
  return fs::is_regular_file(root / kHarnessScript, error);
}

fs::path self_executable() {
  std::error_code error;
  fs::path path = fs::read_symlink("/proc/self/exe", error);
  return error ? fs::path() : path;
}

// The source tree that holds the harness; throws Error(kNotFound) with a hint.
fs::path find_source_root() {
  if (const char* root = std::getenv("LOOM_SOURCE_DIR"); root != nullptr && *root != '\0') {
    if (!has_harness(root))
      throw Error(ErrorKind::kNotFound, std::string("LOOM_SOURCE_DIR=") + root + " has no " + kHarnessScript,
                  "point LOOM_SOURCE_DIR at a Loom source tree");
    return root;
  }
  for (fs::path dir = self_executable().parent_path(); !dir.empty(); dir = dir.parent_path()) {
    if (has_harness(dir)) return dir;
    if (dir == dir.root_path()) break;
  }
  // __FILE__ is <root>/src/cli/bench_command.cc when the build passes absolute paths (CMake does).
  const fs::path compiled_from = fs::path(__FILE__).parent_path().parent_path().parent_path();
  if (compiled_from.is_absolute() && has_harness(compiled_from)) return compiled_from;
  throw Error(ErrorKind::kNotFound, std::string("cannot find ") + kHarnessScript,
              "set LOOM_SOURCE_DIR to the Loom source tree");
}

std::string find_python(const fs::path& source_root) {
  if (const char* python = std::getenv("LOOM_PYTHON"); python != nullptr && *python != '\0') return python;
  std::error_code error;
  const fs::path venv_python = source_root / ".venv" / "bin" / "python";
  if (fs::exists(venv_python, error)) return venv_python.string();
  return "python3";
}

int run_bench(const std::vector<std::string>& passthrough) {
  const fs::path root = find_source_root();
  const std::string python = find_python(root);
  std::vector<std::string> args = {python, (root / kHarnessScript).string()};
  if (const fs::path self = self_executable(); !self.empty()) {
    args.push_back("--loom-binary");
    args.push_back(self.string());
  }
  args.insert(args.end(), passthrough.begin(), passthrough.end());
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());  // returns only on failure
  throw Error(ErrorKind::kNotFound, "cannot run " + python + ": " + std::strerror(errno),
              "set LOOM_PYTHON to a Python 3 with scripts/python-requirements.txt installed");
}

}  // namespace

CommandRunner register_bench(CLI::App& app) {
  // Everything after `bench` belongs to the harness (its own --help included).
  app.prefix_command();
  app.set_help_flag();
  app.allow_extras();
  app.footer("Arguments go to bench/harness/loom_bench.py: `loom bench --help` lists them.");
  return [&app] { return run_bench(app.remaining()); };
}

}  // namespace loom::cli
