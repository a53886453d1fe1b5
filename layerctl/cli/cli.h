// The `layerctl` tool's verbs: each lives in its own file (cli/VERB.cc) and
// adds its own subcommand, its flags and what it does, through its Add
// function; main.cc calls them all. What several verbs share is here.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "cache/catalog.h"
#include "common/status.h"
#include "layerctl/publish.h"

namespace strata::layerctl::cli {

// What the verbs share: the global flags, and the chosen verb's exit code.
struct Cli {
  std::string store_url;  // --store
  bool as_json = false;   // --json
  int exit_code = 0;
  // The store's catalog (--store, else $STRATA_STORE, else the default).
  Result<cache::Catalog> OpenCatalog() const;
};

using AddVerb = void (*)(CLI::App& app, Cli& cli);
void AddBuild(CLI::App&, Cli&);
void AddPush(CLI::App&, Cli&);
void AddSettings(CLI::App&, Cli&);
void AddPull(CLI::App&, Cli&);
void AddLs(CLI::App&, Cli&);
void AddInspect(CLI::App&, Cli&);
void AddVerify(CLI::App&, Cli&);
void AddTag(CLI::App&, Cli&);
void AddRm(CLI::App&, Cli&);
void AddGc(CLI::App&, Cli&);

// Prints "layerctl: ERROR" and returns 1.
int Fail(const Status& s);

// --compress of build and push: what a push encodes chunks with.
inline constexpr const char* kCompressHelp =
    "chunk encoding in the store: none, zstd or zstd:LEVEL (1-19; default: the store's setting, zstd:1)";
Result<PushOptions> ParsePushOptions(const std::string& compress);
// --tag NAME:VERSION, when given.
Result<std::optional<cache::LayerRef>> ParseOptionalTag(const std::string& tag);
// What a push did: the digest on stdout and a summary on stderr, or JSON.
void PrintPush(const PushReport& report, const std::optional<cache::LayerRef>& tag, bool as_json);
// A layer's manifest in brief (build, pull, inspect).
nlohmann::json ManifestSummary(const Digest128& digest, const cache::Manifest& manifest);

}  // namespace strata::layerctl::cli
