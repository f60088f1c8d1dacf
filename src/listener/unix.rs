//! gRPC on a unix socket (`--grpc-uds`, the reference's `GRPC_UDS`), for a sidecar in the
//! same pod: the socket file is created with [`SOCKET_MODE`], a stale one left by a killed
//! process is replaced, and the file is removed when the listener is dropped (at shutdown).

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::{UnixListener, UnixStream};

use super::Listen;

/// Mode of the socket file: read-write for everyone. Connecting to a unix socket needs
/// write permission on it, and a sidecar usually runs as another user (Istio's proxy as
/// 1337) without a group in common; what guards the socket is the directory it lives in (a
/// volume only the pod's containers mount), as for any file there.
pub const SOCKET_MODE: u32 = 0o666;

/// A bound unix socket that removes its file when dropped.
#[derive(Debug)]
pub struct UnixSocketListener {
    listener: UnixListener,
    path: PathBuf,
    /// Device and inode of the file this listener created, so that drop never removes a
    /// file another process has put at the path since.
    file: (u64, u64),
}

impl UnixSocketListener {
    /// Binds `path`, replacing a stale socket file there, and sets [`SOCKET_MODE`].
    ///
    /// # Errors
    /// `path` exists and is not a socket, or another process is listening on it, or the
    /// socket cannot be created (missing directory, permissions, a path over 107 bytes).
    pub async fn bind(path: &Path) -> io::Result<UnixSocketListener> {
        remove_stale(path).await?;
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))?;
        let metadata = std::fs::symlink_metadata(path)?;
        Ok(UnixSocketListener {
            listener,
            path: path.to_path_buf(),
            file: (metadata.dev(), metadata.ino()),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Removes a socket file nobody listens on; refuses a path that is not a socket (a typo
/// must not delete a file) or whose socket is still served.
async fn remove_stale(path: &Path) -> io::Result<()> {
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    if !metadata.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "the path exists and is not a socket; refusing to replace it",
        ));
    }
    match UnixStream::connect(path).await {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            "another process is listening on this socket",
        )),
        Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path)
        }
        Err(error) => Err(error),
    }
}

impl Listen for UnixSocketListener {
    type Stream = UnixStream;

    async fn accept(&self) -> io::Result<(UnixStream, String)> {
        let (stream, _) = self.listener.accept().await?;
        Ok((stream, format!("unix:{}", self.path.display())))
    }
}

impl Drop for UnixSocketListener {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|metadata| (metadata.dev(), metadata.ino()) == self.file);
        if ours && let Err(error) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), "cannot remove the gRPC socket: {error}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_the_file_removed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rls.sock");
        // A socket file whose listener is gone, as a killed process leaves it.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let listener = UnixSocketListener::bind(&path)
            .await
            .expect("stale replaced");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, SOCKET_MODE);
        // A second server on the same path is refused while the first listens.
        let error = UnixSocketListener::bind(&path).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::AddrInUse, "{error}");
        drop(listener);
        assert!(!path.exists(), "the socket file outlived its listener");
    }

    #[tokio::test]
    async fn a_path_that_is_not_a_socket_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        std::fs::write(&path, "keep me").unwrap();
        let error = UnixSocketListener::bind(&path).await.unwrap_err();
        assert!(error.to_string().contains("not a socket"), "{error}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "keep me");
    }

    #[tokio::test]
    async fn drop_leaves_a_file_that_replaced_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rls.sock");
        let listener = UnixSocketListener::bind(&path).await.unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "someone else's").unwrap();
        drop(listener);
        assert!(path.exists());
    }
}
