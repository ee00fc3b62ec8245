// diff_gemm_classes: match two ledgers by (site, occurrence) and keep class changes.
#include <map>
#include <utility>

#include "tpcheck/forensics.h"

namespace tpcheck {

std::vector<GemmClassDiff> diff_gemm_classes(const std::vector<GemmRecord>& single,
                                             const std::vector<GemmRecord>& sharded) {
  // (site, occurrence) → index into `sharded`.
  std::map<std::pair<std::string, int>, std::size_t> sharded_at;
  std::map<std::string, int> seen;
  for (std::size_t i = 0; i < sharded.size(); ++i) {
    sharded_at[{sharded[i].site, seen[sharded[i].site]++}] = i;
  }
  seen.clear();
  std::vector<GemmClassDiff> diffs;
  for (const GemmRecord& s : single) {
    const int occurrence = seen[s.site]++;
    auto it = sharded_at.find({s.site, occurrence});
    if (it == sharded_at.end()) continue;
    const GemmRecord& d = sharded[it->second];
    const bool class_differs = d.math_class != s.math_class;
    const bool algorithm_differs = !s.same_algorithm(d);
    if (class_differs || algorithm_differs) {
      diffs.push_back({s.site, occurrence, s, d, class_differs, algorithm_differs});
    }
  }
  return diffs;
}

}  // namespace tpcheck
