// `loom` command-line entry point. Subcommands live in cli/*_command.cc.
#include <cstdio>

int main(int argc, char** argv) {
  std::fprintf(stderr, "loom: subcommands not wired yet\n");
  return 2;
}
