#include "peer/placement.h"

#include <algorithm>

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

}  // namespace ckptd::peer
