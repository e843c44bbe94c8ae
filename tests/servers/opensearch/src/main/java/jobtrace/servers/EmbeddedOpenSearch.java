package jobtrace.servers;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.opensearch.analysis.common.CommonAnalysisPlugin;
import org.opensearch.common.settings.Settings;
import org.opensearch.env.Environment;
import org.opensearch.http.HttpServerTransport;
import org.opensearch.index.reindex.ReindexPlugin;
import org.opensearch.node.InternalSettingsPreparer;
import org.opensearch.node.Node;
import org.opensearch.painless.PainlessPlugin;
import org.opensearch.transport.Netty4Plugin;

/**
 * A single-node OpenSearch 2.19 started in-process from Maven Central jars.
 *
 * <p>Why: the tests need a real OpenSearch REST API, but no distribution tarball
 * can be downloaded here; the jars can. Bootstrap (bootstrap checks, JarHell,
 * SecurityManager) is skipped on purpose: we call Node directly.
 *
 * <p>Usage: {@code EmbeddedOpenSearch <dir> <httpPort> <transportPort>}. {@code dir}
 * holds home/, data/ and logs/; starting again on the same dir reuses the data.
 * Once ready it prints one line {@code JOBTRACE_OPENSEARCH_READY http=127.0.0.1:<port>}
 * on stdout. SIGTERM/SIGINT close the node cleanly. With
 * {@code -Djobtrace.exitOnStdinEof=true} the JVM also exits when stdin reaches EOF,
 * so a crashed parent (pytest) does not leave an orphan JVM behind.
 */
public final class EmbeddedOpenSearch extends Node {

    private EmbeddedOpenSearch(Environment env) {
        super(env,
              List.of(Netty4Plugin.class, CommonAnalysisPlugin.class, PainlessPlugin.class, ReindexPlugin.class),
              true);
    }

    static Settings settings(Path dir, String httpPort, String transportPort) {
        return Settings.builder()
            .put("cluster.name", "jobtrace-test")
            .put("node.name", "jobtrace-node-0")
            .put("path.home", dir.resolve("home").toString())
            .put("path.data", dir.resolve("data").toString())
            .put("path.logs", dir.resolve("logs").toString())
            .put("network.host", "127.0.0.1")
            .put("http.port", httpPort)
            .put("transport.port", transportPort)
            .put("discovery.type", "single-node")
            .put("cluster.routing.allocation.disk.threshold_enabled", false)
            .put("indices.breaker.total.use_real_memory", false)
            .put("action.auto_create_index", true)
            .build();
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: EmbeddedOpenSearch <dir> <httpPort> <transportPort>");
            System.exit(2);
        }
        Path dir = Paths.get(args[0]).toAbsolutePath();
        for (String sub : new String[] {"home", "data", "logs"}) {
            Files.createDirectories(dir.resolve(sub));
        }
        Settings settings = settings(dir, args[1], args[2]);
        Environment env = InternalSettingsPreparer.prepareEnvironment(
            settings, Map.of(), null, () -> "jobtrace-node-0");
        EmbeddedOpenSearch node = new EmbeddedOpenSearch(env);
        CountDownLatch closed = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                node.close();
                node.awaitClose(20, TimeUnit.SECONDS);
            } catch (IOException | InterruptedException e) {
                e.printStackTrace();
            } finally {
                closed.countDown();
            }
        }, "jobtrace-shutdown"));

        node.start();
        HttpServerTransport http = node.injector().getInstance(HttpServerTransport.class);
        int port = http.boundAddress().publishAddress().getPort();
        System.out.println("JOBTRACE_OPENSEARCH_READY http=127.0.0.1:" + port);
        System.out.flush();

        if (Boolean.getBoolean("jobtrace.exitOnStdinEof")) {
            Thread watchdog = new Thread(() -> {
                try (InputStream in = System.in) {
                    while (in.read() != -1) { /* discard */ }
                } catch (IOException ignored) {
                    // treat a broken stdin like EOF
                }
                System.exit(0);
            }, "jobtrace-stdin-watchdog");
            watchdog.setDaemon(true);
            watchdog.start();
        }
        closed.await();
    }
}
