// One loader of libarchive for the API's tar bridge and the microVM
// initramfs.
#include "common/archive_api.h"

#include "common/dynlib.h"

namespace strata {

const ArchiveApi& Archive() {
  static const ArchiveApi api = [] {
    ArchiveApi a;
    auto lib = DynamicLibrary::Open(STRATA_ARCHIVE_SONAME, "libarchive13");
    if (!lib.ok()) {
      a.status = lib.status();
      return a;
    }
    auto get = [&](auto& fn, const char* name) {
      if (a.status.ok()) a.status = lib->Resolve(fn, name);
    };
    get(a.read_new, "archive_read_new");
    get(a.read_support_format_tar, "archive_read_support_format_tar");
    get(a.read_support_filter_all, "archive_read_support_filter_all");
    get(a.read_open_fd, "archive_read_open_fd");
    get(a.read_next_header, "archive_read_next_header");
    get(a.read_data, "archive_read_data");
    get(a.read_free, "archive_read_free");
    get(a.error_string, "archive_error_string");
    get(a.entry_pathname, "archive_entry_pathname");
    get(a.entry_filetype, "archive_entry_filetype");
    get(a.entry_perm, "archive_entry_perm");
    get(a.entry_symlink, "archive_entry_symlink");
    get(a.entry_hardlink, "archive_entry_hardlink");
    get(a.write_new, "archive_write_new");
    get(a.write_set_format_pax_restricted, "archive_write_set_format_pax_restricted");
    get(a.write_open, "archive_write_open");
    get(a.write_header, "archive_write_header");
    get(a.write_data, "archive_write_data");
    get(a.write_close, "archive_write_close");
    get(a.write_free, "archive_write_free");
    get(a.entry_new, "archive_entry_new");
    get(a.entry_free, "archive_entry_free");
    get(a.entry_set_pathname, "archive_entry_set_pathname");
    get(a.entry_set_filetype, "archive_entry_set_filetype");
    get(a.entry_set_perm, "archive_entry_set_perm");
    get(a.entry_set_size, "archive_entry_set_size");
    get(a.entry_set_symlink, "archive_entry_set_symlink");
    get(a.entry_set_mtime, "archive_entry_set_mtime");
    get(a.write_set_format_cpio_newc, "archive_write_set_format_cpio_newc");
    get(a.write_open_filename, "archive_write_open_filename");
    get(a.entry_set_rdev, "archive_entry_set_rdev");
    get(a.entry_set_nlink, "archive_entry_set_nlink");
    return a;
  }();
  return api;
}

}  // namespace strata
