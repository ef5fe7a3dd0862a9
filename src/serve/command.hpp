// `sapiens-seg serve`: the HTTP inference server as a subcommand of the CLI. main.cpp adds the
// subcommand with add_serve_command() and, once it is parsed, calls run_serve().
#pragma once

#include <CLI/CLI.hpp>

#include "cli/option_flags.hpp"
#include "serve/server.hpp"

namespace sapiens_seg::serve {

struct ServeCommand {
  ServerConfig config;
  cli::OptionValues load;  // the segment subcommand's load flags (--mode, --device, ...)
  CLI::App* app = nullptr;
};

// Adds `serve` and its flags to `app`; `command` must outlive the parse.
CLI::App* add_serve_command(CLI::App& app, ServeCommand& command);

// Runs the server until SIGTERM or SIGINT; the process's exit status. Throws Error when a model
// cannot be loaded or the address cannot be bound.
int run_serve(const ServeCommand& command);

}  // namespace sapiens_seg::serve
