//! The table of cases. A case is a scenario named after what it exercises; it runs in a fresh
//! directory of its own and leaves its log in `Ctx::steps`. Cases are grouped by family (one
//! module each); the order of the table is the order of the output.

mod attrs;
mod dirs;
pub(crate) mod files;
mod names;
mod perm;
mod space;

use crate::ctx::Ctx;

#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub name: &'static str,
    pub run: fn(&mut Ctx),
}

macro_rules! table {
    ($($module:ident :: $name:ident),* $(,)?) => {
        pub const CASES: &[Case] = &[$(Case { name: stringify!($name), run: $module::$name }),*];
    };
}

table! {
    files::open_creat_excl_existing,
    files::open_trunc,
    files::open_append_pwrite,
    files::open_directory_and_nofollow,
    files::open_errors,
    files::open_create_modes,
    files::open_tmpfile,
    files::read_write_basic,
    files::pread_pwrite_holes,
    files::seek_data_hole,
    files::seek_end_cur,
    files::truncate_grow_shrink,
    files::unlink_open_file,
    files::rename_open_file,
    files::sparse_4gib,
    files::mmap_shared_write,
    files::fsync_fdatasync,
    files::direct_io,
    files::flock_and_ofd_locks,
    space::fallocate_modes,
    space::fallocate_punch_hole,
    space::copy_file_range_basic,
    names::rename_file_over_file,
    names::rename_type_mismatch,
    names::rename_dir_over_dir,
    names::rename_into_own_subdir,
    names::rename_moves_dir_updates_nlink,
    names::rename_noreplace,
    names::rename_exchange,
    names::rename_times,
    names::hard_links,
    names::symlinks,
    names::mkdir_rmdir,
    names::mknod_special_files,
    attrs::chmod_modes,
    attrs::chown_as_root,
    attrs::utimensat_times,
    attrs::times_follow_changes,
    attrs::xattrs,
    attrs::access_checks,
    attrs::statfs_sanity,
    dirs::readdir_names_and_types,
    dirs::readdir_1000_entries,
    dirs::readdir_while_unlinking,
    dirs::readdir_seek,
    perm::perm_create_in_root_dir,
    perm::perm_created_objects_owned_by_caller,
    perm::perm_sticky_directory,
    perm::perm_chmod_chown_others_file,
    perm::perm_read_write_search,
    perm::perm_xattrs_of_others_file,
    perm::perm_setuid_cleared_on_write,
}

pub fn find(name: &str) -> Option<&'static Case> {
    CASES.iter().find(|c| c.name == name)
}
