// Subcommands of the qmoe tool; each returns the process exit code.
#ifndef QMOE_TOOLS_QMOE_COMMANDS_H_
#define QMOE_TOOLS_QMOE_COMMANDS_H_

int run_info_command(int argc, char** argv);
int run_run_command(int argc, char** argv);
int run_cache_command(int argc, char** argv);
int run_store_command(int argc, char** argv);

#endif  // QMOE_TOOLS_QMOE_COMMANDS_H_
