# The Debian package: `cpack --config <build>/CPackConfig.cmake` makes corral_<version>_<arch>.deb
# from a built tree, no root needed. It holds the runtime and system install components
# (packaging/CMakeLists.txt); its Depends come from dpkg-shlibdeps on the binaries (the Debian
# libraries they link), plus procps for the unit's /bin/kill.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME corral)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "application server: HTTP/1.1, WebSocket, TLS, HTTP/3, workers")
set(CPACK_PACKAGE_DESCRIPTION
    "corral serves HTTP/1.1, WebSocket, TLS and HTTP/3 on every core under a small supervisor, \
and starts a worker process per address (a session, a document, a room) on demand. The package \
holds corral, the notes demo worker, systemd units (corral.service, corral.socket, \
corral-https.socket), a logrotate file and /etc/corral/corral.toml.")
set(CPACK_PACKAGE_CONTACT
    "corral maintainers <maintainers@users.noreply.a-seed-bb1a682d.example>")
# DESTDIR staging, so the system component's absolute /etc paths land in the package; the
# prefix is then CPACK_INSTALL_PREFIX (the build's own CMAKE_INSTALL_PREFIX otherwise).
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime system)
set(CPACK_COMPONENTS_GROUPING ALL_COMPONENTS_IN_ONE)
set(CPACK_DEBIAN_PACKAGE_NAME corral)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION httpd)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "procps, systemd | adduser")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${CMAKE_CURRENT_LIST_DIR}/../deb/postinst ${CMAKE_CURRENT_LIST_DIR}/../deb/prerm
    ${CMAKE_CURRENT_LIST_DIR}/../deb/postrm ${CMAKE_CURRENT_LIST_DIR}/../deb/conffiles)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# Debug symbols stay in the build tree; gzip: quick to make (a sanitized build's binaries are big).
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_COMPRESSION_TYPE gzip)
include(CPack)
