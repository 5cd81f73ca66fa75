// The argument loop every `qmoe` subcommand's parser runs: each option in turn with its value,
// an option given twice refused (rather than the last one silently winning), and complaints
// printed as "qmoe <command>: ..." followed by the command's usage on stderr, exit code 2.
#ifndef QMOE_TOOLS_QMOE_OPTION_SCANNER_H_
#define QMOE_TOOLS_QMOE_OPTION_SCANNER_H_

#include <cstdio>
#include <set>
#include <string>

class OptionScanner {
 public:
  using Usage = void (*)(std::FILE* out);

  OptionScanner(const char* command, Usage usage, int argc, char** argv)
      : command_(command), usage_(usage), argc_(argc), argv_(argv) {}

  // Moves to the next argument (past the previous option's value unless it was a flag); false
  // after the last. Returns 2 in *code (and false) when the argument repeats an option.
  bool next(int* code);
  // The option now, and the argument after it (null when it is the last).
  const char* arg() const { return argv_[i_]; }
  const char* value() const { return i_ + 1 < argc_ ? argv_[i_ + 1] : nullptr; }
  bool is(const char* name) const;
  // The option takes no value: next() does not skip the following argument.
  void flag() { flag_ = true; }
  // Whether `name` was among the options so far.
  bool given(const char* name) const { return seen_.count(name) != 0; }

  // "qmoe <command>: <arg> <what>", the usage, 2.
  int bad(const char* what) const;
  // "qmoe <command>: unknown option '<arg>'", the usage, 2.
  int unknown() const;
  // "qmoe <command>: <why>", the usage, 2: for options that do not go together.
  int refuse(const char* why) const;

 private:
  const char* command_;
  Usage usage_;
  int argc_;
  char** argv_;
  int i_ = -1;
  bool flag_ = true;  // nothing to skip before the first argument
  std::set<std::string> seen_;
};

#endif  // QMOE_TOOLS_QMOE_OPTION_SCANNER_H_
