# The desktop app as a Debian package (scripts/package runs `cpack`): what `cmake --install`
# installs (the inspector, shardscope-capture, shardscope-check and shardscope-run, the Python
# package for Debian's python3, the desktop entry, the icon and the snapshot MIME type) under
# /usr. Its dependencies are computed from the executables by dpkg-shlibdeps: Debian's Qt 6
# and QCustomPlot libraries (and simdjson, zlib); python3 for the two Python commands.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME shardscope)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Inspector for ZeRO-3 / FSDP2 sharded training")
set(CPACK_PACKAGE_DESCRIPTION
    "ShardScope attaches to a live DeepSpeed ZeRO-3, PyTorch FSDP2 or ShardScope-engine run "
    "and shows each parameter's partition state, owner, external registrations and gathers, "
    "flags reads of parameters a module neither owns nor registered, with the line that "
    "fixes them, and opens the snapshots a run or shardscope-check wrote.")
set(CPACK_PACKAGE_CONTACT "ShardScope developers <shardscope@users.noreply.github.com>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "python3")
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://github.com/shardscope/shardscope")
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/package)
include(CPack)
