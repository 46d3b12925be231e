// The daemon's option table: each option's name, its --help line, its text in the configuration
// reference (docs/CONFIGURATION.md "Configuration", `ckptd --help-config`) and its DaemonOptions
// field, declared once (options_table.cc). options.cc parses flags and config files through it and
// prints the help and the reference from it, so none of them can drift from the fields.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "options.h"

namespace ckptd {
namespace options_internal {

using Setter = std::function<absl::Status(DaemonOptions&, absl::string_view)>;
// An option's value in `o` as the configuration reference shows a default (Markdown).
using Getter = std::function<std::string(const DaemonOptions&)>;

struct Field {
  Setter set;
  Getter get;
};

// One option: its name, a line for --help, its documentation for the configuration reference
// (docs/CONFIGURATION.md "Configuration", printed by --help-config), and its field. `default_doc`
// is the default as the reference shows it when the field's own default is not it (a derived
// default:
// "`<state_dir>/data`", "(none)"); empty: the default-constructed DaemonOptions' value.
struct OptionDef {
  std::string name;
  std::string help;
  std::string doc;
  Field field;
  std::string default_doc;
};

// Every option, in the order of the configuration reference.
const std::vector<OptionDef>& OptionDefs();
// The option named `name` (underscores), or null.
const OptionDef* FindOptionDef(const std::string& name);

}  // namespace options_internal
}  // namespace ckptd
