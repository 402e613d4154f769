-- wrk script of bench/http_api.py: POST /v1/commands with a fresh Idempotency-Key on every request.
--
-- Run with as many threads as connections (wrk -t N -c N): each thread then owns one keep-alive connection
-- and one InventoryItem, as each client of the Python bench does, and sends its requests one after the other.
-- Environment (set by bench/http_api.py):
--   BENCH_KEY     the tenant's API key (Authorization: Bearer ...)
--   BENCH_RUN     a prefix making this run's idempotency keys unique
--   BENCH_ITEMS   the items' ids, comma-separated, one per thread
--   BENCH_CREATE  "1": each thread's first command creates its item (201 expected), the others 200
-- Every response is checked against the status expected; done() prints one line the bench parses:
--   commitline-wrk: responses=N unexpected=N first=<status> <body>

local items = {}
for id in string.gmatch(os.getenv("BENCH_ITEMS") or "", "[^,]+") do
    items[#items + 1] = id
end
local threads = {}

function setup(thread)
    table.insert(threads, thread)
    thread:set("index", #threads)
end

function init(args)
    local item = items[index]
    if item == nil then
        error("thread " .. index .. " has no item: BENCH_ITEMS names " .. #items .. " (run as many threads as items)")
    end
    run = os.getenv("BENCH_RUN") .. "-" .. index .. "-"
    expect_created = os.getenv("BENCH_CREATE") == "1"
    body = '{"type":"receive_stock","item_id":"' .. item .. '","quantity":1}'
    headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. os.getenv("BENCH_KEY")}
    sent, responses, unexpected, first = 0, 0, 0, ""
end

function request()
    sent = sent + 1
    headers["Idempotency-Key"] = run .. sent
    return wrk.format("POST", "/v1/commands", headers, body)
end

function response(status, response_headers, response_body)
    responses = responses + 1
    local expected = (expect_created and responses == 1) and 201 or 200
    if status ~= expected then
        unexpected = unexpected + 1
        if first == "" then
            first = status .. " (expected " .. expected .. ") " .. string.sub(response_body or "", 1, 300)
        end
    end
end

function done(summary, latency, requests)
    local total, wrong, shown = 0, 0, ""
    for _, thread in ipairs(threads) do
        total = total + (thread:get("responses") or 0)
        wrong = wrong + (thread:get("unexpected") or 0)
        local first_seen = thread:get("first")
        if shown == "" and first_seen ~= nil and first_seen ~= "" then
            shown = first_seen
        end
    end
    io.write(string.format("commitline-wrk: responses=%d unexpected=%d first=%s\n", total, wrong,
                           (string.gsub(shown, "\n", " "))))
end
