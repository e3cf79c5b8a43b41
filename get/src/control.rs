//! The control file beside `FILE.part`: which version is being downloaded and which of its bytes
//! are on disk.
//!
//! It never claims a byte that is not on disk: the ranges it lists were written and
//! `fdatasync`ed before it was (see [`Control::save`]), and it replaces the last one by an atomic
//! rename, so a `kill -9` or a power cut at any moment leaves either the old control file or the
//! new one, whole.

use std::fs::{self, File};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use crate::digest::Expected;
use crate::ranges::RangeSet;

const MAGIC: &str = "rangeway-get 1";

/// What identifies the version being downloaded: with it, a resume either continues that
/// version or starts over, never splices two.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Version {
    pub(crate) length: u64,
    /// Strong, with its quotes.
    pub(crate) etag: Option<String>,
    /// Only when strong (RFC 9110 §8.8.2.2): a client may send it in If-Range.
    pub(crate) last_modified: Option<String>,
}

impl Version {
    /// The If-Range value that pins it, if it can be pinned.
    pub(crate) fn validator(&self) -> Option<&str> {
        self.etag.as_deref().or(self.last_modified.as_deref())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Control {
    pub(crate) url: String,
    pub(crate) download_id: String,
    pub(crate) version: Version,
    pub(crate) digests: Vec<Expected>,
    pub(crate) done: RangeSet,
}

impl Control {
    /// The control file of `part`.
    pub(crate) fn path_for(part: &Path) -> PathBuf {
        with_suffix(part, ".ctl")
    }

    /// The control file at `path`: `Ok(None)` when there is none, `Err` with why when it cannot
    /// be used (the download then starts over).
    pub(crate) fn load(path: &Path) -> Result<Option<Self>, String> {
        let text = match fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        Self::parse(&text)
            .map(Some)
            .ok_or_else(|| format!("{} is not a control file of this version", path.display()))
    }

    fn parse(text: &str) -> Option<Self> {
        let mut lines = text.lines();
        if lines.next()? != MAGIC {
            return None;
        }
        let (mut url, mut download_id, mut length, mut etag, mut last_modified, mut done) =
            (None, None, None, None, None, None);
        let (mut digests, mut ended) = (Vec::new(), false);
        for line in lines {
            // Nothing after the end line; without it, the file was cut short.
            if ended {
                return None;
            }
            if line == "end" {
                ended = true;
                continue;
            }
            let (key, value) = line.split_once(' ')?;
            match key {
                "url" => url = Some(value.to_owned()),
                "download-id" => download_id = Some(value.to_owned()),
                "length" => length = Some(value.parse().ok()?),
                "etag" => etag = Some(value.to_owned()),
                "last-modified" => last_modified = Some(value.to_owned()),
                "digest" => digests.push(Expected::from_line(value)?),
                "done" => done = Some(value.parse().ok()?),
                _ => return None,
            }
        }
        if !ended {
            return None;
        }
        let version = Version { length: length?, etag, last_modified };
        Some(Self { url: url?, download_id: download_id?, version, digests, done: done? })
    }

    fn render(&self) -> String {
        let mut text = format!(
            "{MAGIC}\nurl {}\ndownload-id {}\nlength {}\n",
            self.url, self.download_id, self.version.length
        );
        if let Some(etag) = &self.version.etag {
            text += &format!("etag {etag}\n");
        }
        if let Some(date) = &self.version.last_modified {
            text += &format!("last-modified {date}\n");
        }
        for digest in &self.digests {
            text += &format!("digest {}\n", digest.to_line());
        }
        text + &format!("done {}\nend\n", self.done)
    }

    /// Writes it to `path` once the bytes it lists are durable: `part` is synced first, then
    /// the new control file is written beside the old, synced, and renamed over it.
    pub(crate) fn save(&self, part: &File, path: &Path) -> io::Result<()> {
        part.sync_data()?;
        let temporary = with_suffix(path, ".new");
        let mut file = File::create(&temporary)?;
        file.write_all(self.render().as_bytes())?;
        file.sync_all()?;
        fs::rename(&temporary, path)?;
        // The rename itself is durable once the folder is.
        if let Some(folder) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            File::open(folder)?.sync_all()?;
        }
        Ok(())
    }
}

/// `path` with `suffix` added to its name: `a.iso` and `.part` make `a.iso.part`.
pub(crate) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_control_file_round_trips_and_anything_else_is_refused() {
        let mut done = RangeSet::default();
        done.insert(0, 1000);
        done.insert(5000, 6000);
        let control = Control {
            url: "https://example.com/a.iso".into(),
            download_id: "get-0123".into(),
            version: Version { length: 10_000, etag: Some("\"v1\"".into()), last_modified: None },
            digests: vec![Expected::sha256_hex(&"ab".repeat(32)).expect("hex")],
            done,
        };
        assert_eq!(Control::parse(&control.render()), Some(control.clone()));
        let text = control.render();
        assert_eq!(Control::parse(&text.replace("length 10000", "length ten")), None);
        assert_eq!(Control::parse(&text.replace(MAGIC, "rangeway-get 2")), None);
        assert_eq!(Control::parse(&text.replace("done ", "gone ")), None);
        assert_eq!(Control::parse(&text[..text.len() / 2]), None, "a torn file is refused whole");
    }
}
