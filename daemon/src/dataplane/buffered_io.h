// An Io that never asks for O_DIRECT (option direct_io=false): everything else is forwarded to
// the wrapped Io.
#pragma once

#include <memory>

#include "ckptd/io.h"

namespace ckptd {

std::unique_ptr<Io> NewBufferedIo(std::unique_ptr<Io> inner);

}  // namespace ckptd
