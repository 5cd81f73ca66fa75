// The version ABI: the version of the library actually loaded.
#include "qmoe/qmoe.h"

extern "C" {

QMOE_API unsigned qmoe_version_number(void) {
  return QMOE_VERSION_NUMBER;
}

QMOE_API const char* qmoe_version_string(void) {
  return QMOE_VERSION_STRING;
}

}  // extern "C"
