// libarchive, loaded on first use (common/dynlib.h) rather than linked:
// most runs of the tools never read or write an archive. The functions
// strata calls, resolved once; `status` says why they are not there.
#pragma once

#include <archive.h>
#include <archive_entry.h>

#include "common/status.h"

namespace strata {

struct ArchiveApi {
  Status status;
  decltype(&archive_read_new) read_new = nullptr;
  decltype(&archive_read_support_format_tar) read_support_format_tar = nullptr;
  decltype(&archive_read_support_filter_all) read_support_filter_all = nullptr;
  decltype(&archive_read_open_fd) read_open_fd = nullptr;
  decltype(&archive_read_next_header) read_next_header = nullptr;
  decltype(&archive_read_data) read_data = nullptr;
  decltype(&archive_read_free) read_free = nullptr;
  decltype(&archive_error_string) error_string = nullptr;
  decltype(&archive_entry_pathname) entry_pathname = nullptr;
  decltype(&archive_entry_filetype) entry_filetype = nullptr;
  decltype(&archive_entry_perm) entry_perm = nullptr;
  decltype(&archive_entry_symlink) entry_symlink = nullptr;
  decltype(&archive_entry_hardlink) entry_hardlink = nullptr;
  decltype(&archive_write_new) write_new = nullptr;
  decltype(&archive_write_set_format_pax_restricted) write_set_format_pax_restricted = nullptr;
  decltype(&archive_write_open) write_open = nullptr;
  decltype(&archive_write_header) write_header = nullptr;
  decltype(&archive_write_data) write_data = nullptr;
  decltype(&archive_write_close) write_close = nullptr;
  decltype(&archive_write_free) write_free = nullptr;
  decltype(&archive_entry_new) entry_new = nullptr;
  decltype(&archive_entry_free) entry_free = nullptr;
  decltype(&archive_entry_set_pathname) entry_set_pathname = nullptr;
  decltype(&archive_entry_set_filetype) entry_set_filetype = nullptr;
  decltype(&archive_entry_set_perm) entry_set_perm = nullptr;
  decltype(&archive_entry_set_size) entry_set_size = nullptr;
  decltype(&archive_entry_set_symlink) entry_set_symlink = nullptr;
  decltype(&archive_entry_set_mtime) entry_set_mtime = nullptr;
  decltype(&archive_write_set_format_cpio_newc) write_set_format_cpio_newc = nullptr;
  decltype(&archive_write_open_filename) write_open_filename = nullptr;
  decltype(&archive_entry_set_rdev) entry_set_rdev = nullptr;
  decltype(&archive_entry_set_nlink) entry_set_nlink = nullptr;
};

// The process's one copy (thread-safe; loaded on the first call).
const ArchiveApi& Archive();

}  // namespace strata
