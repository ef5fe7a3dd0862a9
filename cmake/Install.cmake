# Installs the library, its public headers, the bundled cards and the CLI, and exports a CMake
# package: find_package(sapiens_seg) then target_link_libraries(app sapiens_seg::sapiens_seg).
include(CMakePackageConfigHelpers)

install(TARGETS sapiens_seg EXPORT sapiens_segTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS sapiens-seg RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/sapiens_seg DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${CMAKE_BINARY_DIR}/generated/include/sapiens_seg/version.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/sapiens_seg)
install(FILES ${SAPIENS_SEG_CARD_FILES} DESTINATION ${CMAKE_INSTALL_DATADIR}/sapiens_seg/cards)

set(_cfgdir ${CMAKE_INSTALL_LIBDIR}/cmake/sapiens_seg)
install(EXPORT sapiens_segTargets NAMESPACE sapiens_seg:: DESTINATION ${_cfgdir})
configure_package_config_file(cmake/sapiens_segConfig.cmake.in
  ${CMAKE_BINARY_DIR}/sapiens_segConfig.cmake INSTALL_DESTINATION ${_cfgdir})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/sapiens_segConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/sapiens_segConfig.cmake
              ${CMAKE_BINARY_DIR}/sapiens_segConfigVersion.cmake DESTINATION ${_cfgdir})
