// railyard convert: reads the files (or stdin), converts (cli/convert.h), writes the TrainingJob as YAML with the
// notes as comments on top and on stderr.
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "cli/cli.h"
#include "cli/convert.h"
#include "cli/manifest_yaml.h"
#include "common/atomic_file.h"
#include "common/error.h"
#include "operator/api.h"

namespace railyard::cli {

namespace {
constexpr const char* kConvertHelp =
    R"(usage: railyard convert FILE... [--output FILE]

Reads a Kubeflow PyTorchJob (kubeflow.org/v1) or a Kubeflow Trainer TrainJob (trainer.kubeflow.org/v1alpha1) together
with the ClusterTrainingRuntime or TrainingRuntime it names (YAML or JSON, one or more files, '-' for stdin, several
documents per file allowed) and writes the equivalent Railyard TrainingJob (spec.program) as YAML, to stdout or
--output. Every setting that is not carried over, or carried over with another meaning, is named in a comment at the
top of the output and on stderr. What cannot be converted without changing its meaning is refused, naming the field
(for example torchrun started by a shell script in a job of several pods), and so is an output that Railyard's own
parser would refuse. `kubectl get ... -o yaml` output (a List) is read as its items. Mapping and the variables each
system sets: docs/migrating.md.

Exit codes: 0 converted, 1 the input cannot be converted (message names the field), 2 bad command line.
)";
}  // namespace

int run_convert(const Args& args) {
  std::vector<std::string> files;
  std::string output;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::cout << kConvertHelp;
      return kExitOk;
    }
    if (a == "--output" || a == "-o") {
      if (i + 1 >= args.size()) throw UsageError{a + " needs a file name"};
      output = args[++i];
    } else if (a.size() > 1 && a[0] == '-') {
      throw UsageError{"convert: unknown flag '" + a + "'"};
    } else {
      files.push_back(a);
    }
  }
  if (files.empty()) throw UsageError{"convert: give the PyTorchJob or TrainJob manifest (a file, or - for stdin)"};
  std::vector<nlohmann::json> docs;
  for (const std::string& f : files) {
    std::string text;
    if (f == "-") {
      text.assign(std::istreambuf_iterator<char>(std::cin), {});
    } else {
      std::ifstream in(f);
      if (!in) throw Error(f + ": cannot read");
      text.assign(std::istreambuf_iterator<char>(in), {});
    }
    for (auto& d : parse_manifests(text, f == "-" ? "stdin" : f)) docs.push_back(std::move(d));
  }
  const Conversion c = convert_manifests(docs);
  // What the operator would refuse is refused here, before anyone applies it: the operator's own parser.
  if (const auto parsed = op::parse_job(c.job); parsed.violation)
    throw Error("the converted TrainingJob would be refused by Railyard: " + parsed.violation->message +
                " (change the input's setting it comes from, docs/migrating.md, and convert again)");
  std::ostringstream out;
  out << "# Converted by railyard convert from "
      << c.job["metadata"]["annotations"]["railyard.dev/converted-from"].get<std::string>()
      << " (docs/migrating.md).\n";
  if (!c.notes.empty()) out << "# Not carried over, or changed in meaning:\n";
  for (const std::string& n : c.notes) {
    out << "#   - " << n << "\n";
    std::cerr << "railyard convert: note: " << n << "\n";
  }
  out << to_yaml(c.job);
  if (output.empty()) {
    std::cout << out.str();
  } else {
    write_file_atomic(output, out.str());
  }
  return kExitOk;
}

}  // namespace railyard::cli
