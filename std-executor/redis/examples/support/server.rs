//! The benches' Redis server: started on a free loopback port, without persistence.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A `redis-server` on a free loopback port, killed when dropped; `.1` is the port.
pub struct Server(pub Child, pub u16);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts one (no persistence) and waits until it answers.
pub fn start_server() -> Server {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server (Debian: apt-get install redis-server)");
    // Dropped (killed and waited for) on every path from here on.
    let server = Server(child, port);
    let url = format!("redis://127.0.0.1:{port}");
    for _ in 0..500 {
        if let Ok(mut c) = redis::Client::open(url.as_str()).and_then(|c| c.get_connection()) {
            if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                return server;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("redis-server did not start");
}
