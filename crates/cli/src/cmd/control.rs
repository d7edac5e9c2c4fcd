//! The control channel of a running mount: a unix socket in the mount's run directory. One
//! request per connection, a line of text in, the reply out. Requests: `stat` (one JSON
//! document), `flush` (lines `progress DONE TOTAL`, then one JSON line with the result),
//! `sync` (one JSON line, `{"error": null}` when everything is durable).
//! Only root and the user who mounted may talk to it: the directory is 0700 and owned by that
//! user, and the daemon also checks the peer's uid (SO_PEERCRED).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

/// Serves requests until `quit`; `handle` answers every other request on the stream.
pub fn serve(listener: &UnixListener, owner: u32, handle: &(dyn Fn(&str, &mut dyn Write) + Sync)) {
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let Some(peer) = peer_uid(&stream) else { continue };
        if peer != 0 && peer != owner {
            let _ = writeln!(stream, "{{\"error\":\"permission denied\"}}");
            continue;
        }
        let mut line = String::new();
        if BufReader::new(&stream).read_line(&mut line).is_err() {
            continue;
        }
        match line.trim() {
            // Sent by the daemon itself after unmount (only root or the owner get here).
            "quit" => return,
            request => handle(request, &mut stream),
        }
    }
}

fn peer_uid(stream: &UnixStream) -> Option<u32> {
    use std::os::fd::AsRawFd;
    // SAFETY: getsockopt(SO_PEERCRED) fills a ucred of the given size.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &raw mut len,
        )
    };
    (rc == 0).then_some(cred.uid)
}

/// Sends `request` to the mount's control socket and returns the reply.
pub fn request(socket: &Path, request: &str) -> std::io::Result<String> {
    send(&mut UnixStream::connect(socket)?, request)
}

/// Sends `request` on a connected control stream and returns the whole reply.
pub fn send(stream: &mut UnixStream, request: &str) -> std::io::Result<String> {
    stream.write_all(format!("{request}\n").as_bytes())?;
    stream.shutdown(std::net::Shutdown::Write)?;
    let mut reply = String::new();
    std::io::Read::read_to_string(stream, &mut reply)?;
    Ok(reply)
}

/// Sends `request` to the mount at `mountpoint` and parses its one-document JSON reply; a
/// reply with a non-null `error` is the error.
pub fn ask(mountpoint: &Path, request: &str) -> crate::error::CliResult<serde_json::Value> {
    use crate::error::CliError;
    let (mut stream, _) = connect(mountpoint)?;
    let reply =
        send(&mut stream, request).map_err(|e| CliError::Other(format!("control socket: {e}")))?;
    let value: serde_json::Value = serde_json::from_str(&reply)
        .map_err(|e| CliError::Other(format!("bad reply from the daemon: {e}: {reply}")))?;
    match value.get("error").filter(|e| !e.is_null()) {
        Some(err) => Err(CliError::Other(format!(
            "daemon: {request}: {}",
            err.as_str().map_or_else(|| err.to_string(), str::to_owned)
        ))),
        None => Ok(value),
    }
}

/// Connects to the control socket of the mount at `mountpoint` (as given by the user), with
/// the error a user can act on.
pub fn connect(mountpoint: &Path) -> crate::error::CliResult<(UnixStream, std::path::PathBuf)> {
    use crate::error::CliError;
    let mountpoint = super::rundir::canonical_mountpoint(mountpoint)
        .map_err(|e| CliError::Usage(format!("{}: {e}", mountpoint.display())))?;
    let socket = super::rundir::socket(&super::rundir::dir_for(&mountpoint));
    let stream = UnixStream::connect(&socket).map_err(|e| {
        CliError::Other(format!(
            "no nvstack daemon answers for {} ({}: {e}); is it mounted, and are you root or the \
             user who mounted it?",
            mountpoint.display(),
            socket.display()
        ))
    })?;
    Ok((stream, mountpoint))
}
