# Fails when a file of the repository points into a sibling directory of the checkout, such as
# the research notes that lived beside the development tree: a clone does not have it, so what
# the docs and tests need from there belongs in the repository (docs/peers.md).
set(needle "../")
string(APPEND needle "shared")  # assembled, so that this file does not match itself
set(found "")
file(GLOB_RECURSE files LIST_DIRECTORIES false RELATIVE "${SOURCE_DIR}"
     "${SOURCE_DIR}/*.md" "${SOURCE_DIR}/*.txt" "${SOURCE_DIR}/*.cmake" "${SOURCE_DIR}/*.in"
     "${SOURCE_DIR}/*.toml" "${SOURCE_DIR}/*.h" "${SOURCE_DIR}/*.cc" "${SOURCE_DIR}/*.py"
     "${SOURCE_DIR}/*.sh")
foreach(file IN LISTS files)
  if(file MATCHES "^(build|\\.venv[^/]*|\\.git)/")  # build trees and environments (.venv, .venv-vllm)
    continue()
  endif()
  file(READ "${SOURCE_DIR}/${file}" text)
  string(FIND "${text}" "${needle}" at)
  if(NOT at EQUAL -1)
    list(APPEND found "${file}")
  endif()
endforeach()
if(found)
  list(JOIN found ", " found_text)
  message(FATAL_ERROR "these files point to ${needle}, which a clone does not have: ${found_text}")
endif()
