//! `file`: Linux's policy - dirty files in the order they became dirty, all dirty pages of each
//! file, until the target is met (whole files; recency and location are ignored).

use super::{DirtyView, Loc, PageKey, Policy, sort_by_location};

#[derive(Debug, Clone, Copy)]
pub struct File;

impl Policy for File {
    fn name(&self) -> &'static str {
        "file"
    }

    fn uses_files(&self) -> bool {
        true
    }

    fn select(&self, view: &DirtyView, target: usize) -> Vec<(PageKey, Loc)> {
        let mut chosen = Vec::new();
        for (object, pages) in &view.files {
            if chosen.len() >= target {
                break;
            }
            chosen.extend(
                pages.iter().map(|(&index, &loc)| (PageKey { object: *object, index }, loc)),
            );
        }
        sort_by_location(&mut chosen);
        chosen
    }
}
