// The `tpcheck` program. Placeholder until the CLI lands (issue 3).
#include <cstdio>
int main() {
  std::puts("tpcheck: no commands yet");
  return 0;
}
