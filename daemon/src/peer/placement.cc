#include "peer/placement.h"

#include <algorithm>
#include <map>
#include <utility>

namespace ckptd::peer {

std::vector<std::string> PlacementOrder(std::vector<std::string> registered,
                                        const std::string& self) {
  std::sort(registered.begin(), registered.end());
  registered.erase(std::unique(registered.begin(), registered.end()), registered.end());
  std::erase(registered, self);
  auto first = std::upper_bound(registered.begin(), registered.end(), self);
  std::rotate(registered.begin(), first, registered.end());
  return registered;
}

std::vector<std::string> DomainOrder(
    const std::vector<std::string>& order, const std::string& self_domain,
    const std::function<std::optional<std::string>(const std::string&)>& domain_of,
    size_t lookups_max) {
  // j: the nodes of this domain just before this node on the ring.
  size_t j = 0;
  for (size_t k = order.size(); k-- > 0 && order.size() - k <= lookups_max;) {
    std::optional<std::string> d = domain_of(order[k]);
    if (!d || *d != self_domain) break;
    ++j;
  }
  // The other domains' nodes within the window, grouped by domain in order of appearance.
  std::vector<std::pair<std::string, std::vector<size_t>>> groups;
  std::map<std::string, size_t> group_of;
  for (size_t i = 0; i < order.size() && i < lookups_max; ++i) {
    std::optional<std::string> d = domain_of(order[i]);
    if (!d || *d == self_domain) continue;
    auto [it, added] = group_of.emplace(*d, groups.size());
    if (added) groups.push_back({*d, {}});
    groups[it->second].second.push_back(i);
  }
  std::vector<bool> taken(order.size(), false);
  std::vector<std::string> out;
  for (const auto& [domain, members] : groups) {
    const size_t i = members[j % members.size()];
    taken[i] = true;
    out.push_back(order[i]);
  }
  for (size_t i = 0; i < order.size(); ++i) {
    if (!taken[i]) out.push_back(order[i]);
  }
  return out;
}

}  // namespace ckptd::peer
