//! An EC2 endpoint on 127.0.0.1 that answers DescribeInstances and DescribeVolumes from a
//! table the test sets, for what moto cannot hold still: instances `stopping` or
//! `shutting-down`, an instance missing from one answer (EC2's eventual consistency), and
//! throttling (503 RequestLimitExceeded) switched on and off.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One instance as DescribeInstances shows it.
#[derive(Clone, Debug)]
pub struct FakeInstance {
    /// `running`, `stopping`, `stopped`, `shutting-down`, `terminated`...
    pub state: String,
    pub private_ip: String,
    pub private_dns: String,
    /// Left out of this many of the next answers that ask for it.
    pub absent_for: usize,
}

#[derive(Default)]
struct Table {
    instances: BTreeMap<String, FakeInstance>,
}

pub struct FakeEc2 {
    pub port: u16,
    table: Arc<Mutex<Table>>,
    throttling: Arc<AtomicBool>,
    requests: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

fn state_code(name: &str) -> u16 {
    match name {
        "pending" => 0,
        "running" => 16,
        "shutting-down" => 32,
        "terminated" => 48,
        "stopping" => 64,
        _ => 80,
    }
}

/// The values of `Filter.N.Value.M` in a form-encoded Query API body.
fn filter_values(body: &str) -> Vec<String> {
    body.split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| k.starts_with("Filter.") && k.contains(".Value."))
        .map(|(_, v)| v.replace("%2D", "-"))
        .collect()
}

impl FakeEc2 {
    pub async fn start() -> FakeEc2 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let table = Arc::new(Mutex::new(Table::default()));
        let throttling = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicUsize::new(0));
        let (t, th, rq) = (table.clone(), throttling.clone(), requests.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let (t, th, rq) = (t.clone(), th.clone(), rq.clone());
                tokio::spawn(async move {
                    let Some(body) = read_request(&mut s).await else {
                        return;
                    };
                    rq.fetch_add(1, Ordering::Relaxed);
                    let (status, reply) = if th.load(Ordering::Relaxed) {
                        (503, THROTTLED.to_string())
                    } else if body.contains("Action=DescribeVolumes") {
                        (200, VOLUMES.to_string())
                    } else {
                        (200, describe(&t, &filter_values(&body)))
                    };
                    let resp = format!(
                        "HTTP/1.1 {status} {}\r\nContent-Type: text/xml;charset=UTF-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
                        if status == 200 {
                            "OK"
                        } else {
                            "Service Unavailable"
                        },
                        reply.len()
                    );
                    let _ = s.write_all(resp.as_bytes()).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        FakeEc2 {
            port,
            table,
            throttling,
            requests,
            task,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn set(&self, id: &str, instance: FakeInstance) {
        self.table
            .lock()
            .unwrap()
            .instances
            .insert(id.to_string(), instance);
    }

    pub fn set_state(&self, id: &str, state: &str) {
        if let Some(i) = self.table.lock().unwrap().instances.get_mut(id) {
            i.state = state.to_string();
        }
    }

    /// Leaves `id` out of the next `answers` answers that ask for it.
    pub fn hide(&self, id: &str, answers: usize) {
        if let Some(i) = self.table.lock().unwrap().instances.get_mut(id) {
            i.absent_for = answers;
        }
    }

    /// How many more answers leave `id` out (0 once the hidden ones were served).
    pub fn hidden_left(&self, id: &str) -> Option<usize> {
        let t = self.table.lock().unwrap();
        t.instances.get(id).map(|i| i.absent_for)
    }

    pub fn throttle(&self, on: bool) {
        self.throttling.store(on, Ordering::Relaxed);
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::Relaxed)
    }
}

impl Drop for FakeEc2 {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one request (headers and a Content-Length body, bounded) and returns its body.
async fn read_request(s: &mut tokio::net::TcpStream) -> Option<String> {
    let mut buf = vec![0u8; 65536];
    let mut seen = Vec::new();
    for _ in 0..64 {
        let n = s.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        seen.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&seen).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let len = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                })
                .unwrap_or(0);
            if seen.len() >= end + 4 + len {
                return Some(text[end + 4..].to_string());
            }
        }
    }
    None
}

fn describe(table: &Mutex<Table>, ids: &[String]) -> String {
    let mut t = table.lock().unwrap();
    let mut items = String::new();
    for id in ids {
        let Some(i) = t.instances.get_mut(id) else {
            continue;
        };
        if i.absent_for > 0 {
            i.absent_for -= 1;
            continue;
        }
        items.push_str(&format!(
            "<item><instanceId>{id}</instanceId><imageId>ami-0abcdef1234567890</imageId>\
             <instanceState><code>{}</code><name>{}</name></instanceState>\
             <privateDnsName>{}</privateDnsName><privateIpAddress>{}</privateIpAddress>\
             <placement><availabilityZone>us-east-1a</availabilityZone></placement>\
             <rootDeviceName>/dev/xvda</rootDeviceName><blockDeviceMapping/></item>",
            state_code(&i.state),
            i.state,
            i.private_dns,
            i.private_ip
        ));
    }
    let reservations = if items.is_empty() {
        "<reservationSet/>".to_string()
    } else {
        format!(
            "<reservationSet><item><reservationId>r-1234567890abcdef0</reservationId>\
             <ownerId>123456789012</ownerId><groupSet/><instancesSet>{items}</instancesSet></item></reservationSet>"
        )
    };
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeInstancesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">\
         <requestId>8f7724cf-496f-496e-8fe3-example</requestId>{reservations}</DescribeInstancesResponse>"
    )
}

const VOLUMES: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeVolumesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>1</requestId><volumeSet/></DescribeVolumesResponse>";

const THROTTLED: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>1</RequestID></Response>";
